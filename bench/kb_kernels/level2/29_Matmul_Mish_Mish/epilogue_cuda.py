# A fused epilogue after the GEMM for KernelBench level 2 problem 29, written for bench/kb_compare.py --from-repo (2026-11-26):
# the GEMM in torch, everything after it in one CUDA kernel, forward only, as an LLM's typical answer.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Linear (cuBLAS) followed by one fused CUDA kernel for: Mish -> Mish.

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <algorithm>

__device__ __forceinline__ float softplus_f(float x) {
    return x > 20.0f ? x : log1pf(expf(x));
}

__device__ __forceinline__ float mish_f(float x) {
    return x * tanhf(softplus_f(x));
}

// One pass over the GEMM output: out = mish(mish(x)), mish(x) = x * tanh(softplus(x))
__global__ void mish_mish_kernel(const float* __restrict__ x,
                        float* __restrict__ out,
                        const int64_t n) {
    const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        out[i] = mish_f(mish_f(x[i]));
    }
}

torch::Tensor mish_mish_cuda(torch::Tensor x) {
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
    mish_mish_kernel<<<blocks, threads, 0, stream>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = r"""
torch::Tensor mish_mish_cuda(torch::Tensor x);
"""

epilogue = load_inline(
    name="kb2_p29_epilogue",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["mish_mish_cuda"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    """
    Matmul (nn.Linear) + fused CUDA epilogue: Mish applied twice in one pass.
    """
    def __init__(self, in_features, out_features):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        return epilogue.mish_mish_cuda(x.contiguous())
