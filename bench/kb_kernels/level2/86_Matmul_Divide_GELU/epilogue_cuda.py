# A fused epilogue after the GEMM for KernelBench level 2 problem 86, written for bench/kb_compare.py --from-repo (2026-11-26):
# the GEMM in torch, everything after it in one CUDA kernel, forward only, as an LLM's typical answer.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Linear (cuBLAS) followed by one fused CUDA kernel for: divide by a scalar -> GELU (erf form).

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <algorithm>

__device__ __forceinline__ float gelu_erf(float x) {
    return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

// One pass over the GEMM output: y = x / divisor (as * (1/divisor), like PyTorch); out = 0.5 * y * (1 + erf(y / sqrt(2)))
__global__ void div_gelu_kernel(const float* __restrict__ x,
                        float* __restrict__ out,
                        const int64_t n,
                        const float inv_divisor) {
    const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float y = x[i] * inv_divisor;
        out[i] = gelu_erf(y);
    }
}

torch::Tensor div_gelu_cuda(torch::Tensor x, double divisor) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");

    const c10::cuda::CUDAGuard device_guard(x.device());
    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) return out;
    // PyTorch's CUDA true-division by a Python scalar multiplies by the float reciprocal.
    const float inv_divisor = 1.0f / static_cast<float>(divisor);
    const int threads = 256;
    const int64_t needed = (n + threads - 1) / threads;
    const int64_t max_blocks =
        static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
    const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(needed, max_blocks)));
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    div_gelu_kernel<<<blocks, threads, 0, stream>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), n,
        inv_divisor);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = r"""
torch::Tensor div_gelu_cuda(torch::Tensor x, double divisor);
"""

epilogue = load_inline(
    name="kb2_p86_epilogue",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["div_gelu_cuda"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    """
    Matmul (nn.Linear) + fused CUDA epilogue: / divisor -> exact (erf) GELU.
    """
    def __init__(self, input_size, output_size, divisor):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(input_size, output_size)
        self.divisor = divisor

    def forward(self, x):
        x = self.linear(x)
        return epilogue.div_gelu_cuda(x.contiguous(), float(self.divisor))
