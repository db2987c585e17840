# A fused epilogue after the GEMM for KernelBench level 2 problem 12, written for bench/kb_compare.py --from-repo (2026-11-26):
# the GEMM in torch, everything after it in one CUDA kernel, forward only, as an LLM's typical answer.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Gemm (cuBLAS) followed by one fused CUDA kernel for: multiply -> LeakyReLU.

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <algorithm>

// One pass over the GEMM output: y = x * multiplier; out = y > 0 ? y : y * negative_slope
__global__ void mul_leaky_relu_kernel(const float* __restrict__ x,
                        float* __restrict__ out,
                        const int64_t n,
                        const float multiplier,
                        const float negative_slope) {
    const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i] * multiplier;
        out[i] = v > 0.0f ? v : v * negative_slope;
    }
}

torch::Tensor mul_leaky_relu_cuda(torch::Tensor x, double multiplier, double negative_slope) {
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
    mul_leaky_relu_kernel<<<blocks, threads, 0, stream>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), n,
        static_cast<float>(multiplier), static_cast<float>(negative_slope));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = r"""
torch::Tensor mul_leaky_relu_cuda(torch::Tensor x, double multiplier, double negative_slope);
"""

epilogue = load_inline(
    name="kb2_p12_epilogue",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["mul_leaky_relu_cuda"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    """
    Gemm (nn.Linear) + fused CUDA epilogue: x * multiplier -> LeakyReLU(negative_slope).
    """
    def __init__(self, in_features, out_features, multiplier, negative_slope):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.multiplier = multiplier
        # Kept (parameter-free) so the module layout matches the reference; the kernel applies it.
        self.leaky_relu = nn.LeakyReLU(negative_slope)
        self.negative_slope = negative_slope

    def forward(self, x):
        x = self.gemm(x)
        return epilogue.mul_leaky_relu_cuda(
            x.contiguous(), float(self.multiplier), float(self.leaky_relu.negative_slope))
