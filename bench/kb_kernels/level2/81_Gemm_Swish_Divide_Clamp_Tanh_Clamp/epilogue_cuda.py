# A fused epilogue after the GEMM for KernelBench level 2 problem 81, written for bench/kb_compare.py --from-repo (2026-11-26):
# the GEMM in torch, everything after it in one CUDA kernel, forward only, as an LLM's typical answer.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Gemm (cuBLAS) followed by one fused CUDA kernel for: Swish -> /2 -> clamp -> tanh -> clamp.

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <algorithm>

__device__ __forceinline__ float sigmoid_f(float x) {
    return 1.0f / (1.0f + expf(-x));
}

__device__ __forceinline__ float clamp_pm1(float x) {
    return fminf(fmaxf(x, -1.0f), 1.0f);
}

// One pass over the GEMM output: out = clamp(tanh(clamp((x * sigmoid(x)) / 2, -1, 1)), -1, 1)
__global__ void swish_div_clamp_tanh_clamp_kernel(const float* __restrict__ x,
                        float* __restrict__ out,
                        const int64_t n) {
    const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i];
        float y = v * sigmoid_f(v);   // Swish
        y = y * 0.5f;                 // / 2.0 (exact: power of two)
        y = clamp_pm1(y);
        y = tanhf(y);
        out[i] = clamp_pm1(y);
    }
}

torch::Tensor swish_div_clamp_tanh_clamp_cuda(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");

    const c10::cuda::CUDAGuard device_guard(x.device());
    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) return out;

    const int threads = 256;
    const int64_t needed = (n + threads - 1) / threads;
    const int64_t max_blocks =
        static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
    const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(needed, max_blocks)));
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    swish_div_clamp_tanh_clamp_kernel<<<blocks, threads, 0, stream>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = r"""
torch::Tensor swish_div_clamp_tanh_clamp_cuda(torch::Tensor x);
"""

epilogue = load_inline(
    name="kb2_p81_epilogue",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["swish_div_clamp_tanh_clamp_cuda"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    """
    Gemm (nn.Linear) + fused CUDA epilogue: Swish -> / 2 -> clamp(-1, 1) -> tanh -> clamp(-1, 1).
    """
    def __init__(self, in_features, out_features, bias=True):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=bias)

    def forward(self, x):
        x = self.gemm(x)
        return epilogue.swish_div_clamp_tanh_clamp_cuda(x.contiguous())
