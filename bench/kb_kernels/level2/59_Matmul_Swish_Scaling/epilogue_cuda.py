# A fused epilogue after the GEMM for KernelBench level 2 problem 59, written for bench/kb_compare.py --from-repo (2026-11-26):
# the GEMM in torch, everything after it in one CUDA kernel, forward only, as an LLM's typical answer.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Linear (cuBLAS) followed by one fused CUDA kernel for: Swish -> scaling.

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <algorithm>

__device__ __forceinline__ float sigmoid_f(float x) {
    return 1.0f / (1.0f + expf(-x));
}

// One pass over the GEMM output: out = (x * sigmoid(x)) * scaling_factor
__global__ void swish_scale_kernel(const float* __restrict__ x,
                        float* __restrict__ out,
                        const int64_t n,
                        const float scaling_factor) {
    const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i];
        const float s = v * sigmoid_f(v);
        out[i] = s * scaling_factor;
    }
}

torch::Tensor swish_scale_cuda(torch::Tensor x, double scaling_factor) {
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
    swish_scale_kernel<<<blocks, threads, 0, stream>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), n,
        static_cast<float>(scaling_factor));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = r"""
torch::Tensor swish_scale_cuda(torch::Tensor x, double scaling_factor);
"""

epilogue = load_inline(
    name="kb2_p59_epilogue",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["swish_scale_cuda"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    """
    Matmul (nn.Linear) + fused CUDA epilogue: Swish (x * sigmoid(x)) -> * scaling_factor.
    """
    def __init__(self, in_features, out_features, scaling_factor):
        super(ModelNew, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.matmul(x)
        return epilogue.swish_scale_cuda(x.contiguous(), float(self.scaling_factor))
