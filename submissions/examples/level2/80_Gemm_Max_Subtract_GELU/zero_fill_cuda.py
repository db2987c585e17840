# expected: pass
# level2/80's output is always zero: the max over dim 1 (keepdim) leaves one column, the mean over dim 1 is that
# column itself, so the subtraction gives 0 and GELU(0) = 0 (for finite inputs). The fastest correct answer writes
# zeros of the reference's shape (batch, 1) and dtype with a one-line CUDA kernel; its backward is zero too (the
# reference's gradients are exactly zero: x - mean(x) over one element has derivative 1 - 1). The judge passes it
# and marks the record `degenerate_problem`: its speedup says nothing about kernels.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

// A (batch, 1) tensor of zeros with x's dtype and device.
torch::Tensor zeros_per_row(torch::Tensor x);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>

namespace {

constexpr int kThreads = 256;

template <typename scalar_t>
__global__ void fill_zero_kernel(scalar_t* __restrict__ out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = static_cast<scalar_t>(0.0f);
}

}  // namespace

torch::Tensor zeros_per_row(torch::Tensor x) {
  TORCH_CHECK(x.is_cuda(), "x must be a CUDA tensor");
  TORCH_CHECK(x.dim() == 2, "x must be (batch, in_features)");
  const c10::cuda::CUDAGuard device_guard(x.device());
  auto out = torch::empty({x.size(0), 1}, x.options());
  const int64_t n = out.numel();
  if (n == 0) return out;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  TORCH_CHECK(blocks <= INT32_MAX, "input too large for a 1-D grid");
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16, out.scalar_type(),
                                  "fill_zero", [&] {
    fill_zero_kernel<scalar_t><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(out.data_ptr<scalar_t>(), n);
  });
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}
"""

zero_ops = load_inline(
    name="gemm_max_sub_gelu_zeros",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["zeros_per_row"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class ZeroOutput(torch.autograd.Function):
    """The reference's output (zeros of shape (batch, 1)) and its gradients (zeros)."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight, bias)
        return zero_ops.zeros_per_row(x)

    @staticmethod
    def backward(ctx, grad_out):
        return tuple(torch.zeros_like(t) if needed else None
                     for t, needed in zip(ctx.saved_tensors, ctx.needs_input_grad))


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, max_dim):
        super().__init__()
        # Only a max over dim 1 leaves the single column that the mean over dim 1 cancels.
        if max_dim not in (1, -1):
            raise ValueError(f"the zero shortcut holds for max_dim = 1 only, not {max_dim}")
        self.gemm = nn.Linear(in_features, out_features)   # the reference's weights load here; the output ignores them

    def forward(self, x):
        return ZeroOutput.apply(x, self.gemm.weight, self.gemm.bias)
