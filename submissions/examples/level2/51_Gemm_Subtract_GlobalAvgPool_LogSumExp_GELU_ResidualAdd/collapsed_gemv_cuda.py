# expected: pass
# An algebraic shortcut, exact in real arithmetic: the mean over the output features of x @ W^T + b - s is
# x @ mean_rows(W) + mean(b - s), a GEMV; logsumexp over that single column is the identity; then GELU and the
# residual add as the reference does them. The forward reads W once (column means, recomputed on every call) instead
# of running a 2048 x 8192 x 8192 GEMM, so it runs far below the reference's roofline and is still right for every
# input. The backward follows the same collapse in PyTorch ops.
import math

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

// Returns {out, m, w_mean}: out = gelu(m) + x broadcast over the features, m (batch,) the per-row mean of the
// reference's GEMM output minus `subtract`, w_mean (in_features,) the column means of the weight. m and w_mean are
// kept for backward.
std::vector<torch::Tensor> collapsed_forward(torch::Tensor x, torch::Tensor weight,
                                             c10::optional<torch::Tensor> bias, torch::Tensor subtract);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <vector>

namespace {

constexpr int kThreads = 256;       // a power of two: the block reductions halve it
constexpr int kRowsPerChunk = 64;   // weight rows one thread sums in the first pass

// Pass 1 over the weight (rows x cols, row-major): partial[r, i] = sum of weight[o, i] over the rows o of chunk r.
// Neighbouring threads read neighbouring columns (coalesced); the row chunks give enough blocks to keep the memory
// system busy, where one thread per column would not.
__global__ void column_partial_sums_kernel(const float* __restrict__ weight, float* __restrict__ partial,
                                           int64_t rows, int64_t cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= cols) return;
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * kRowsPerChunk;
  const int64_t end = begin + kRowsPerChunk < rows ? begin + kRowsPerChunk : rows;
  float acc = 0.0f;
  for (int64_t o = begin; o < end; ++o) acc += weight[o * cols + i];
  partial[chunk * cols + i] = acc;
}

// Pass 2: w_mean[i] = (sum of partial[r, i] over the chunks, in order) / rows. No atomics: deterministic.
__global__ void column_mean_kernel(const float* __restrict__ partial, float* __restrict__ w_mean,
                                   int64_t chunks, int64_t rows, int64_t cols) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= cols) return;
  float acc = 0.0f;
  for (int64_t r = 0; r < chunks; ++r) acc += partial[r * cols + i];
  w_mean[i] = acc / static_cast<float>(rows);
}

// Sum of the block's `value`s (every thread gets it). `scratch` holds kThreads floats.
__device__ float block_sum(float value, float* scratch) {
  scratch[threadIdx.x] = value;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (threadIdx.x < stride) scratch[threadIdx.x] += scratch[threadIdx.x + stride];
    __syncthreads();
  }
  const float total = scratch[0];
  __syncthreads();   // scratch may be reused right after
  return total;
}

// shift = mean over the out_features of (bias - subtract); bias may be absent. One block.
__global__ void shift_kernel(const float* __restrict__ bias, const float* __restrict__ subtract,
                             float* __restrict__ shift, int64_t n) {
  __shared__ float scratch[kThreads];
  float acc = 0.0f;
  for (int64_t j = threadIdx.x; j < n; j += kThreads) acc += (bias != nullptr ? bias[j] : 0.0f) - subtract[j];
  const float total = block_sum(acc, scratch);
  if (threadIdx.x == 0) shift[0] = total / static_cast<float>(n);
}

// One block per row b: m[b] = x[b, :] . w_mean + shift (the reference's mean over the GEMM's features; its
// logsumexp over that one value returns it unchanged), then out[b, j] = gelu(m[b]) + x[b, j].
__global__ void gemv_gelu_residual_kernel(const float* __restrict__ x, const float* __restrict__ w_mean,
                                          const float* __restrict__ shift, float* __restrict__ m_out,
                                          float* __restrict__ out, int64_t cols) {
  __shared__ float scratch[kThreads];
  const int64_t b = blockIdx.x;
  const float* row = x + b * cols;
  float acc = 0.0f;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) acc += row[j] * w_mean[j];
  const float m = block_sum(acc, scratch) + shift[0];
  const float g = 0.5f * m * (1.0f + erff(m * 0.70710678118654752440f));   // exact (erf) GELU, as F.gelu
  if (threadIdx.x == 0) m_out[b] = m;
  float* out_row = out + b * cols;
  for (int64_t j = threadIdx.x; j < cols; j += kThreads) out_row[j] = g + row[j];
}

void check_f32_cuda(const torch::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32");
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dims");
}

}  // namespace

std::vector<torch::Tensor> collapsed_forward(torch::Tensor x, torch::Tensor weight,
                                             c10::optional<torch::Tensor> bias, torch::Tensor subtract) {
  check_f32_cuda(x, "x", 2);
  check_f32_cuda(weight, "weight", 2);
  check_f32_cuda(subtract, "subtract", 1);
  const int64_t batch = x.size(0), in_features = x.size(1), out_features = weight.size(0);
  TORCH_CHECK(weight.size(1) == in_features, "weight must be (out_features, in_features)");
  TORCH_CHECK(out_features > 0, "out_features must be positive");
  TORCH_CHECK(subtract.size(0) == out_features, "subtract must have out_features elements");
  const float* bias_ptr = nullptr;
  if (bias.has_value() && bias->defined()) {
    check_f32_cuda(*bias, "bias", 1);
    TORCH_CHECK(bias->size(0) == out_features, "bias must have out_features elements");
    bias_ptr = bias->data_ptr<float>();
  }
  const c10::cuda::CUDAGuard device_guard(x.device());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  auto out = torch::empty_like(x);
  auto m = torch::empty({batch}, x.options());
  auto w_mean = torch::empty({in_features}, x.options());
  auto shift = torch::empty({1}, x.options());
  const int64_t chunks = (out_features + kRowsPerChunk - 1) / kRowsPerChunk;
  auto partial = torch::empty({chunks, in_features}, x.options());
  if (in_features == 0 || batch == 0) return {out, m, w_mean};
  TORCH_CHECK(chunks <= 65535 && batch <= INT32_MAX, "input too large for this grid");

  const unsigned col_blocks = static_cast<unsigned>((in_features + kThreads - 1) / kThreads);
  column_partial_sums_kernel<<<dim3(col_blocks, static_cast<unsigned>(chunks)), kThreads, 0, stream>>>(
      weight.data_ptr<float>(), partial.data_ptr<float>(), out_features, in_features);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  column_mean_kernel<<<col_blocks, kThreads, 0, stream>>>(
      partial.data_ptr<float>(), w_mean.data_ptr<float>(), chunks, out_features, in_features);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  shift_kernel<<<1, kThreads, 0, stream>>>(bias_ptr, subtract.data_ptr<float>(), shift.data_ptr<float>(),
                                           out_features);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  gemv_gelu_residual_kernel<<<static_cast<unsigned>(batch), kThreads, 0, stream>>>(
      x.data_ptr<float>(), w_mean.data_ptr<float>(), shift.data_ptr<float>(), m.data_ptr<float>(),
      out.data_ptr<float>(), in_features);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, m, w_mean};
}
"""

collapsed_ops = load_inline(
    name="gemm_mean_collapse",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["collapsed_forward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)

INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


class CollapsedGemmMeanGeluResidual(torch.autograd.Function):
    """gelu(mean_o(x @ W^T + b - s)) + x.detach(); forward is the CUDA kernels above."""

    @staticmethod
    def forward(ctx, x, weight, bias, subtract):
        out, m, w_mean = collapsed_ops.collapsed_forward(x.contiguous(), weight.contiguous(),
                                                         None if bias is None else bias.contiguous(),
                                                         subtract.contiguous())
        ctx.save_for_backward(x, w_mean, m)
        ctx.out_features = weight.shape[0]
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x, w_mean, m = ctx.saved_tensors
        rows = ctx.out_features
        # The residual is detached in the reference, so only the GELU branch carries gradient. d[b] = dL/dm[b]
        # (logsumexp over one value has derivative 1); each of the row's `rows` GEMM outputs gets d[b] / rows.
        gelu_grad = 0.5 * (1.0 + torch.erf(m * math.sqrt(0.5))) + m * torch.exp(-0.5 * m * m) * INV_SQRT_2PI
        d = grad_out.sum(dim=1) * gelu_grad
        per_output = d / rows
        grad_x = d[:, None] * w_mean[None, :] if ctx.needs_input_grad[0] else None
        grad_weight = (per_output @ x.detach()).expand(rows, -1).contiguous() if ctx.needs_input_grad[1] else None
        total = per_output.sum()
        grad_bias = total.expand(rows).contiguous() if ctx.needs_input_grad[2] else None
        grad_subtract = (-total).expand(rows).contiguous() if ctx.needs_input_grad[3] else None
        return grad_x, grad_weight, grad_bias, grad_subtract


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        # The reference's parameters under the reference's names, so its state_dict loads into ours.
        self.gemm = nn.Linear(in_features, out_features, bias=bias)
        self.subtract = nn.Parameter(torch.randn(out_features))

    def forward(self, x):
        return CollapsedGemmMeanGeluResidual.apply(x, self.gemm.weight, self.gemm.bias, self.subtract)
