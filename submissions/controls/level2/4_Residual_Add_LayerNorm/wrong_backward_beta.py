# expected: grad_mismatch
# Planted defect: the final gamma/beta reduction keeps two accumulators per column (chunks k and k + half)
# and adds them for grad gamma, but stores only the first one for grad beta: ln.bias.grad sums the row
# chunks of the first half only, i.e. rows 0..8191 of 16384. The missing half is a sum of 8192 N(0, 1)
# grad_output values per column (std ~90) against a tolerance of 1e-3 + 1e-3 * |ref| (~0.1), so
# virtually every column fails. Forward, grad x / grad residual and ln.weight.grad are correct, hence grad_mismatch (the
# output has a graph and its gradients are wrong: `grad_mismatch_fails`, on in every config that checks
# gradients). Everything else is correct_cuda.py.
# Control for level2/4: LayerNorm(x + residual) as ONE CUDA kernel (one block per row, the row held in
# registers, two-pass mean / variance, so the sum x + residual is never written to memory), with a CUDA
# backward: one kernel computes grad_x (= grad_residual) row by row and, per block of rows, the partial
# column sums of g * xhat (grad gamma) and g (grad beta); a second kernel adds the per-block partials in
# a fixed order. No atomics anywhere, so the gradients are bitwise repeatable.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

// Returns {out, mean, rstd}; mean and rstd have one value per row and are kept for backward.
std::vector<torch::Tensor> add_layernorm_forward(
    torch::Tensor x, torch::Tensor residual, torch::Tensor gamma, torch::Tensor beta, double eps);

// Returns {grad_sum (the gradient of both x and residual), grad_gamma, grad_beta}.
std::vector<torch::Tensor> add_layernorm_backward(
    torch::Tensor grad_out, torch::Tensor x, torch::Tensor residual, torch::Tensor gamma,
    torch::Tensor mean, torch::Tensor rstd);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <vector>

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 256;            // one block per row (forward) / per chunk of rows (backward)
constexpr int kWarps = kThreads / 32;
constexpr int kMaxVecPerThread = 8;      // float4s per thread: rows up to 256 * 4 * 8 = 8192 wide
constexpr int kMaxChunks = 512;          // backward: row chunks, i.e. blocks and partial rows

__device__ __forceinline__ float4 load4(const float* p) {
  return *reinterpret_cast<const float4*>(p);
}
__device__ __forceinline__ void store4(float* p, float4 v) {
  *reinterpret_cast<float4*>(p) = v;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;  // the xor butterfly leaves the same bits in every lane
}

// Sum over the block of (a, b). Every warp reduces the kWarps partials itself (same order in all
// warps), so every thread returns the same value. The trailing barrier lets `red` be reused at once.
__device__ __forceinline__ float2 block_sum2(float a, float b, float (*red)[kWarps]) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  a = warp_sum(a);
  b = warp_sum(b);
  if (lane == 0) {
    red[0][warp] = a;
    red[1][warp] = b;
  }
  __syncthreads();
  float ta = lane < kWarps ? red[0][lane] : 0.0f;
  float tb = lane < kWarps ? red[1][lane] : 0.0f;
  ta = warp_sum(ta);
  tb = warp_sum(tb);
  __syncthreads();
  return make_float2(ta, tb);
}

// Column of float4 number j of this thread; consecutive threads read consecutive float4s.
__device__ __forceinline__ int col_of(int j) { return (j * kThreads + threadIdx.x) * 4; }

template <int VPT>
__global__ void __launch_bounds__(kThreads) add_layernorm_fwd_kernel(
    const float* __restrict__ x, const float* __restrict__ residual,
    const float* __restrict__ gamma, const float* __restrict__ beta, float* __restrict__ out,
    float* __restrict__ mean_out, float* __restrict__ rstd_out, int hidden, float eps) {
  __shared__ float red[2][kWarps];
  const int64_t row_off = static_cast<int64_t>(blockIdx.x) * hidden;
  const float inv_h = 1.0f / static_cast<float>(hidden);

  float4 v[VPT];
  float sum = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int c = col_of(j);
    if (c < hidden) {
      const float4 a = load4(x + row_off + c);
      const float4 b = load4(residual + row_off + c);
      v[j] = make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);   // x + residual
      sum += (v[j].x + v[j].y) + (v[j].z + v[j].w);
    } else {
      v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
  const float mean = block_sum2(sum, 0.0f, red).x * inv_h;

  float sq = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    if (col_of(j) < hidden) {
      const float dx = v[j].x - mean, dy = v[j].y - mean, dz = v[j].z - mean, dw = v[j].w - mean;
      sq += (dx * dx + dy * dy) + (dz * dz + dw * dw);
    }
  }
  const float var = block_sum2(sq, 0.0f, red).x * inv_h;   // biased, as nn.LayerNorm
  const float rstd = rsqrtf(var + eps);
  if (threadIdx.x == 0) {
    mean_out[blockIdx.x] = mean;
    rstd_out[blockIdx.x] = rstd;
  }
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int c = col_of(j);
    if (c < hidden) {
      const float4 g = load4(gamma + c);
      const float4 b = load4(beta + c);
      float4 y;
      y.x = (v[j].x - mean) * rstd * g.x + b.x;
      y.y = (v[j].y - mean) * rstd * g.y + b.y;
      y.z = (v[j].z - mean) * rstd * g.z + b.z;
      y.w = (v[j].w - mean) * rstd * g.w + b.w;
      store4(out + row_off + c, y);
    }
  }
}

// Backward. Block b owns rows [b * rows_per_chunk, (b + 1) * rows_per_chunk). For each row (in order):
//   xhat = (x + residual - mean) * rstd,  wg = g * gamma,
//   grad_sum = rstd * (wg - mean(wg) - xhat * mean(wg * xhat)),
// and each thread accumulates g * xhat and g for its own columns; at the end the block writes its
// partial column sums to part_gamma[b][:] and part_beta[b][:].
template <int VPT>
__global__ void __launch_bounds__(kThreads) add_layernorm_bwd_kernel(
    const float* __restrict__ grad_out, const float* __restrict__ x,
    const float* __restrict__ residual, const float* __restrict__ gamma,
    const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
    float* __restrict__ grad_sum, float* __restrict__ part_gamma, float* __restrict__ part_beta,
    int64_t rows, int hidden, int rows_per_chunk) {
  __shared__ float red[2][kWarps];
  const float inv_h = 1.0f / static_cast<float>(hidden);
  const int64_t row_begin = static_cast<int64_t>(blockIdx.x) * rows_per_chunk;
  const int64_t row_end = min(rows, row_begin + rows_per_chunk);

  float4 gm[VPT], acc_g[VPT], acc_b[VPT];
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int c = col_of(j);
    gm[j] = c < hidden ? load4(gamma + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    acc_g[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    acc_b[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }

  for (int64_t row = row_begin; row < row_end; ++row) {
    const int64_t row_off = row * hidden;
    const float mean = mean_in[row];
    const float rstd = rstd_in[row];
    float4 xh[VPT], wg[VPT];
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int c = col_of(j);
      if (c < hidden) {
        const float4 g = load4(grad_out + row_off + c);
        const float4 a = load4(x + row_off + c);
        const float4 b = load4(residual + row_off + c);
        xh[j].x = ((a.x + b.x) - mean) * rstd;
        xh[j].y = ((a.y + b.y) - mean) * rstd;
        xh[j].z = ((a.z + b.z) - mean) * rstd;
        xh[j].w = ((a.w + b.w) - mean) * rstd;
        wg[j] = make_float4(g.x * gm[j].x, g.y * gm[j].y, g.z * gm[j].z, g.w * gm[j].w);
        s1 += (wg[j].x + wg[j].y) + (wg[j].z + wg[j].w);
        s2 += (wg[j].x * xh[j].x + wg[j].y * xh[j].y) + (wg[j].z * xh[j].z + wg[j].w * xh[j].w);
        acc_g[j].x += g.x * xh[j].x;
        acc_g[j].y += g.y * xh[j].y;
        acc_g[j].z += g.z * xh[j].z;
        acc_g[j].w += g.w * xh[j].w;
        acc_b[j].x += g.x;
        acc_b[j].y += g.y;
        acc_b[j].z += g.z;
        acc_b[j].w += g.w;
      } else {
        xh[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        wg[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
    const float2 s = block_sum2(s1, s2, red);
    const float mean_wg = s.x * inv_h;
    const float mean_wgx = s.y * inv_h;
#pragma unroll
    for (int j = 0; j < VPT; ++j) {
      const int c = col_of(j);
      if (c < hidden) {
        float4 d;
        d.x = rstd * (wg[j].x - mean_wg - xh[j].x * mean_wgx);
        d.y = rstd * (wg[j].y - mean_wg - xh[j].y * mean_wgx);
        d.z = rstd * (wg[j].z - mean_wg - xh[j].z * mean_wgx);
        d.w = rstd * (wg[j].w - mean_wg - xh[j].w * mean_wgx);
        store4(grad_sum + row_off + c, d);
      }
    }
  }

  const int64_t part_off = static_cast<int64_t>(blockIdx.x) * hidden;
#pragma unroll
  for (int j = 0; j < VPT; ++j) {
    const int c = col_of(j);
    if (c < hidden) {
      store4(part_gamma + part_off + c, acc_g[j]);
      store4(part_beta + part_off + c, acc_b[j]);
    }
  }
}

// grad_gamma[c] / grad_beta[c]: the per-chunk partials summed in a fixed order. Two accumulators
// (chunks k and k + half) give the loads some independence; they are added at the end.
__global__ void gamma_beta_reduce_kernel(
    const float* __restrict__ part_gamma, const float* __restrict__ part_beta,
    float* __restrict__ grad_gamma, float* __restrict__ grad_beta, int num_chunks, int hidden) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= hidden) return;
  const int half = (num_chunks + 1) / 2;
  float g0 = 0.0f, g1 = 0.0f, b0 = 0.0f, b1 = 0.0f;
  for (int k = 0; k < half; ++k) {
    const int64_t i0 = static_cast<int64_t>(k) * hidden + c;
    g0 += part_gamma[i0];
    b0 += part_beta[i0];
    if (k + half < num_chunks) {
      const int64_t i1 = static_cast<int64_t>(k + half) * hidden + c;
      g1 += part_gamma[i1];
      b1 += part_beta[i1];
    }
  }
  grad_gamma[c] = g0 + g1;
  grad_beta[c] = b0;
}

void check_f32_cuda(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32");
}

// float4 access needs 16-byte aligned rows: true for fresh allocations; anything else is copied.
torch::Tensor aligned(const torch::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? t : t.clone();
}

int vec_per_thread(int hidden) {
  TORCH_CHECK(hidden % 4 == 0, "hidden size must be a multiple of 4");
  int vpt = 1;
  while (vpt * kThreads * 4 < hidden) vpt *= 2;
  TORCH_CHECK(vpt <= kMaxVecPerThread, "hidden size above ", kMaxVecPerThread * kThreads * 4,
              " is not supported");
  return vpt;
}

void check_shapes(const torch::Tensor& x, const torch::Tensor& residual, const torch::Tensor& gamma) {
  TORCH_CHECK(x.dim() == 2, "expected (rows, hidden)");
  TORCH_CHECK(residual.sizes() == x.sizes(), "x and residual must have the same shape");
  TORCH_CHECK(gamma.dim() == 1 && gamma.size(0) == x.size(1), "gamma must have hidden elements");
  TORCH_CHECK(residual.device() == x.device() && gamma.device() == x.device(),
              "all tensors must be on the same device");
  TORCH_CHECK(x.size(0) <= INT32_MAX, "too many rows");
}

}  // namespace

std::vector<torch::Tensor> add_layernorm_forward(
    torch::Tensor x, torch::Tensor residual, torch::Tensor gamma, torch::Tensor beta, double eps) {
  check_f32_cuda(x, "x");
  check_f32_cuda(residual, "residual");
  check_f32_cuda(gamma, "gamma");
  check_f32_cuda(beta, "beta");
  check_shapes(x, residual, gamma);
  TORCH_CHECK(beta.sizes() == gamma.sizes(), "beta must have hidden elements");
  const c10::cuda::CUDAGuard device_guard(x.device());
  const int64_t rows = x.size(0);
  const int hidden = static_cast<int>(x.size(1));
  auto out = torch::empty_like(x);
  auto mean = torch::empty({rows}, x.options());
  auto rstd = torch::empty({rows}, x.options());
  if (rows == 0) return {out, mean, rstd};
  const int vpt = vec_per_thread(hidden);
  x = aligned(x);
  residual = aligned(residual);
  gamma = aligned(gamma);
  beta = aligned(beta);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const unsigned grid = static_cast<unsigned>(rows);
  const float feps = static_cast<float>(eps);
#define LN_FWD(V)                                                                               \
  add_layernorm_fwd_kernel<V><<<grid, kThreads, 0, stream>>>(                                  \
      x.data_ptr<float>(), residual.data_ptr<float>(), gamma.data_ptr<float>(),                 \
      beta.data_ptr<float>(), out.data_ptr<float>(), mean.data_ptr<float>(),                    \
      rstd.data_ptr<float>(), hidden, feps)
  switch (vpt) {
    case 1: LN_FWD(1); break;
    case 2: LN_FWD(2); break;
    case 4: LN_FWD(4); break;
    default: LN_FWD(8); break;
  }
#undef LN_FWD
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, mean, rstd};
}

std::vector<torch::Tensor> add_layernorm_backward(
    torch::Tensor grad_out, torch::Tensor x, torch::Tensor residual, torch::Tensor gamma,
    torch::Tensor mean, torch::Tensor rstd) {
  check_f32_cuda(grad_out, "grad_out");
  check_f32_cuda(x, "x");
  check_f32_cuda(residual, "residual");
  check_f32_cuda(gamma, "gamma");
  check_f32_cuda(mean, "mean");
  check_f32_cuda(rstd, "rstd");
  check_shapes(x, residual, gamma);
  TORCH_CHECK(grad_out.sizes() == x.sizes(), "grad_out must have the shape of the output");
  TORCH_CHECK(mean.numel() == x.size(0) && rstd.numel() == x.size(0), "one mean / rstd per row");
  const c10::cuda::CUDAGuard device_guard(x.device());
  const int64_t rows = x.size(0);
  const int hidden = static_cast<int>(x.size(1));
  auto grad_sum = torch::empty_like(x);
  auto grad_gamma = torch::zeros_like(gamma);
  auto grad_beta = torch::zeros_like(gamma);
  if (rows == 0) return {grad_sum, grad_gamma, grad_beta};
  const int vpt = vec_per_thread(hidden);
  grad_out = aligned(grad_out);
  x = aligned(x);
  residual = aligned(residual);
  gamma = aligned(gamma);

  // The chunking depends on the number of rows only, so the summation order is fixed.
  const int rows_per_chunk = static_cast<int>((rows + kMaxChunks - 1) / kMaxChunks);
  const int num_chunks = static_cast<int>((rows + rows_per_chunk - 1) / rows_per_chunk);
  auto part_gamma = torch::empty({num_chunks, hidden}, x.options());
  auto part_beta = torch::empty({num_chunks, hidden}, x.options());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
#define LN_BWD(V)                                                                               \
  add_layernorm_bwd_kernel<V><<<static_cast<unsigned>(num_chunks), kThreads, 0, stream>>>(     \
      grad_out.data_ptr<float>(), x.data_ptr<float>(), residual.data_ptr<float>(),              \
      gamma.data_ptr<float>(), mean.data_ptr<float>(), rstd.data_ptr<float>(),                  \
      grad_sum.data_ptr<float>(), part_gamma.data_ptr<float>(), part_beta.data_ptr<float>(),    \
      rows, hidden, rows_per_chunk)
  switch (vpt) {
    case 1: LN_BWD(1); break;
    case 2: LN_BWD(2); break;
    case 4: LN_BWD(4); break;
    default: LN_BWD(8); break;
  }
#undef LN_BWD
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  gamma_beta_reduce_kernel<<<static_cast<unsigned>((hidden + kThreads - 1) / kThreads), kThreads, 0,
                             stream>>>(
      part_gamma.data_ptr<float>(), part_beta.data_ptr<float>(), grad_gamma.data_ptr<float>(),
      grad_beta.data_ptr<float>(), num_chunks, hidden);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {grad_sum, grad_gamma, grad_beta};
}
"""

add_ln_ops = load_inline(
    name="add_layernorm_ops",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["add_layernorm_forward", "add_layernorm_backward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class AddLayerNorm(torch.autograd.Function):
    """LayerNorm(x + residual) over the last dimension; forward and backward are the kernels above."""

    @staticmethod
    def forward(ctx, x, residual, weight, bias, eps):
        hidden = x.shape[-1]
        x2 = x.contiguous().view(-1, hidden)
        r2 = residual.contiguous().view(-1, hidden)
        weight = weight.contiguous()
        out, mean, rstd = add_ln_ops.add_layernorm_forward(x2, r2, weight, bias.contiguous(), float(eps))
        ctx.save_for_backward(x2, r2, weight, mean, rstd)  # x + residual is recomputed in backward
        ctx.shape = x.shape
        return out if x.dim() == 2 else out.view(x.shape)

    @staticmethod
    def backward(ctx, grad_out):
        x2, r2, weight, mean, rstd = ctx.saved_tensors
        grad_sum, grad_weight, grad_bias = add_ln_ops.add_layernorm_backward(
            grad_out.contiguous().view(-1, x2.shape[1]), x2, r2, weight, mean, rstd)
        if len(ctx.shape) != 2:
            grad_sum = grad_sum.view(ctx.shape)
        # d(x + residual)/dx = d(x + residual)/dresidual = identity: both get the same gradient.
        return grad_sum, grad_sum, grad_weight, grad_bias, None


class ModelNew(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.ln = nn.LayerNorm(hidden, eps=1e-5)  # same name (ln.weight, ln.bias) as the reference

    def forward(self, x, residual):
        return AddLayerNorm.apply(x, residual, self.ln.weight, self.ln.bias, self.ln.eps)
