# A fused epilogue after the GEMM for KernelBench level 2 problem 76, written for bench/kb_compare.py --from-repo (2026-11-26):
# the GEMM in torch, everything after it in one CUDA kernel, forward only, as an LLM's typical answer.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Gemm without bias (cuBLAS) followed by one fused CUDA kernel for: + bias -> ReLU.

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <algorithm>

// One pass over the GEMM output: out[r, c] = max(x[r, c] + bias[c], 0)
__global__ void bias_relu_kernel(const float* __restrict__ x,
                        const float* __restrict__ bias,
                        float* __restrict__ out,
                        const int64_t n,
                        const int64_t cols) {
    const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i] + bias[i % cols];
        out[i] = v > 0.0f ? v : 0.0f;
    }
}

torch::Tensor bias_relu_cuda(torch::Tensor x, torch::Tensor bias) {
    TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
    TORCH_CHECK(x.is_contiguous(), "x must be contiguous");
    TORCH_CHECK(x.scalar_type() == torch::kFloat32, "x must be float32");
    TORCH_CHECK(bias.is_cuda(), "bias must be a CUDA tensor");
    TORCH_CHECK(bias.is_contiguous(), "bias must be contiguous");
    TORCH_CHECK(bias.scalar_type() == torch::kFloat32, "bias must be float32");
    TORCH_CHECK(x.dim() >= 1, "x must have at least one dimension");
    TORCH_CHECK(bias.device() == x.device(), "bias and x must be on the same device");
    TORCH_CHECK(bias.numel() == x.size(-1), "bias must have size x.size(-1)");
    const c10::cuda::CUDAGuard device_guard(x.device());
    auto out = torch::empty_like(x);
    const int64_t n = x.numel();
    if (n == 0) return out;
    const int64_t cols = x.size(-1);
    const int threads = 256;
    const int64_t needed = (n + threads - 1) / threads;
    const int64_t max_blocks =
        static_cast<int64_t>(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 32;
    const int blocks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(needed, max_blocks)));
    cudaStream_t stream = at::cuda::getCurrentCUDAStream();
    bias_relu_kernel<<<blocks, threads, 0, stream>>>(
        x.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(), n, cols);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = r"""
torch::Tensor bias_relu_cuda(torch::Tensor x, torch::Tensor bias);
"""

epilogue = load_inline(
    name="kb2_p76_epilogue",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["bias_relu_cuda"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    """
    Gemm (nn.Linear, bias=False) + fused CUDA epilogue: + bias (broadcast over rows) -> ReLU.
    """
    def __init__(self, in_features, out_features, bias_shape):
        super(ModelNew, self).__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.gemm(x)
        return epilogue.bias_relu_cuda(x.contiguous(), self.bias.contiguous())
