# A fused epilogue after the GEMM for KernelBench level 2 problem 40, written for bench/kb_compare.py --from-repo (2026-11-26):
# the GEMM in torch, everything after it in one CUDA kernel, forward only, as an LLM's typical answer.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

# Linear (cuBLAS) followed by one fused CUDA kernel for: scaling + residual add of the GEMM output.

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <algorithm>

// One pass over the GEMM output: out = x * scaling_factor + x  (x is the GEMM output, also the residual)
__global__ void scale_residual_kernel(const float* __restrict__ x,
                        float* __restrict__ out,
                        const int64_t n,
                        const float scaling_factor) {
    const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
        const float v = x[i];
        // Two separate roundings, as in the reference (x * s, then + original_x).
        out[i] = __fadd_rn(__fmul_rn(v, scaling_factor), v);
    }
}

torch::Tensor scale_residual_cuda(torch::Tensor x, double scaling_factor) {
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
    scale_residual_kernel<<<blocks, threads, 0, stream>>>(
        x.data_ptr<float>(), out.data_ptr<float>(), n,
        static_cast<float>(scaling_factor));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    return out;
}
"""

cpp_source = r"""
torch::Tensor scale_residual_cuda(torch::Tensor x, double scaling_factor);
"""

epilogue = load_inline(
    name="kb2_p40_epilogue",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["scale_residual_cuda"],
    verbose=False,
    extra_cuda_cflags=["-O3"],
)


class ModelNew(nn.Module):
    """
    Matmul (nn.Linear) + fused CUDA epilogue: x * scaling_factor + x, where the residual is the
    GEMM output itself (the reference's detached clone), read once from memory.
    """
    def __init__(self, in_features, out_features, scaling_factor):
        super(ModelNew, self).__init__()
        self.matmul = nn.Linear(in_features, out_features)
        self.scaling_factor = scaling_factor

    def forward(self, x):
        x = self.matmul(x)
        return epilogue.scale_residual_cuda(x.contiguous(), float(self.scaling_factor))
