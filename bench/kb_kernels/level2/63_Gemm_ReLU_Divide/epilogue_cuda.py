# A fused epilogue after the GEMM for KernelBench level 2 problem 63, written for bench/kb_compare.py --from-repo (2026-11-26):
# the GEMM in torch, everything after it in one CUDA kernel, forward only, as an LLM's typical answer.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Linear (cuBLAS) followed by one fused CUDA kernel for: ReLU -> divide by a constant.

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <algorithm>

// One pass over the GEMM output: out = max(x, 0) / divisor  (computed as * (1/divisor), like PyTorch's CUDA tensor/scalar division)
__global__ void relu_div_kernel(const float* __restrict__ x,
                        float* __restrict__ out,
                        const int64_t n,
                        const float inv_divisor) {
    const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i];
        const float r = v > 0.0f ? v : 0.0f;
        out[i] = r * inv_divisor;
    }
}

torch::Tensor relu_div_cuda(torch::Tensor x, double divisor) {
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
    relu_div_kernel<<<blocks, threads, 0, stream>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), n,
        inv_divisor);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = r"""
torch::Tensor relu_div_cuda(torch::Tensor x, double divisor);
"""

epilogue = load_inline(
    name="kb2_p63_epilogue",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["relu_div_cuda"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    """
    Gemm (nn.Linear) + fused CUDA epilogue: ReLU -> / divisor.
    """
    def __init__(self, in_features, out_features, divisor):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.divisor = divisor

    def forward(self, x):
        x = self.linear(x)
        return epilogue.relu_div_cuda(x.contiguous(), float(self.divisor))
