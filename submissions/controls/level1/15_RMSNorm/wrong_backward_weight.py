# expected: grad_mismatch (the output has a graph and its weight gradient is wrong: `grad_mismatch_fails`,
#           on in every config that checks gradients; the error names parameter weight)
# Planted defect: the forward and the input gradient are correct (same as correct_cuda.py), but
# the weight gradient misses the factor rstd: stage 1 of the dw reduction sums g * x instead of
# g * x * rstd. With x = randn, mean(x^2) is about 1, so rstd = 1 +- ~1% and the error is small per
# row; summed over 16384 rows it is sum_rows g * x * (1 - rstd), about 1 in absolute terms per
# column against a tolerance of 1e-3 + 1e-3 * |dw| (|dw| ~ 128): emulation on the harness's trial 0
# and grad_output (seed 42) puts 7552 of the 8192 columns out of tolerance (median error 7.9x the
# tolerance, largest error 4.1), while the correct kernel's fp32 dw is within 2.5e-4 of it.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

// Returns {y, rstd}; rstd has one entry per row.
std::vector<torch::Tensor> rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps);
// Returns {grad_x, grad_weight}.
std::vector<torch::Tensor> rmsnorm_backward(torch::Tensor grad_y, torch::Tensor x,
                                            torch::Tensor weight, torch::Tensor rstd);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cstdint>
#include <vector>

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 512;                 // 16 warps per block, one block per row
constexpr int kWarps = kThreads / 32;
constexpr int kMaxVecPerThread = 8;           // row capacity: 512 * 8 * 4 = 16384 floats

// Weight-gradient reduction: (32, 8) blocks, each summing 32 columns over 128 rows.
constexpr int kColTile = 32;
constexpr int kRowThreads = 8;
constexpr int kRowsPerChunk = 128;
constexpr int kFinalThreads = 256;

// ---- block reduction ----------------------------------------------------------------------------

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Block-wide sum; every thread gets the same total. red (kWarps floats) is used by this reduction
// only: a later reduction must use another buffer (a slow warp may still be reading this one).
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  v = warp_sum(v);
  if (lane == 0) red[warp] = v;
  __syncthreads();
  v = lane < kWarps ? red[lane] : 0.0f;
  return warp_sum(v);
}

// ---- a row held in registers ----------------------------------------------------------------------
// A thread holds VPT * 4 elements. VEC: element j is column 4 * (tid + (j / 4) * kThreads) + j % 4
// (needs cols % 4 == 0 and 16-byte aligned rows). Scalar: element j is column tid + j * kThreads.
// Either way: valid iff column < cols; invalid slots hold `fill` and are never stored.

template <int VPT, bool VEC>
__device__ __forceinline__ void load_row(const float* __restrict__ src, int cols,
                                         float (&v)[VPT * 4], float fill) {
  if constexpr (VEC) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (static_cast<int>(threadIdx.x) + k * kThreads) * 4;
      float4 t = make_float4(fill, fill, fill, fill);
      if (c < cols) t = *reinterpret_cast<const float4*>(src + c);
      v[4 * k + 0] = t.x;
      v[4 * k + 1] = t.y;
      v[4 * k + 2] = t.z;
      v[4 * k + 3] = t.w;
    }
  } else {
#pragma unroll
    for (int j = 0; j < VPT * 4; ++j) {
      const int c = static_cast<int>(threadIdx.x) + j * kThreads;
      v[j] = c < cols ? src[c] : fill;
    }
  }
}

template <int VPT, bool VEC>
__device__ __forceinline__ void store_row(float* __restrict__ dst, int cols, const float (&v)[VPT * 4]) {
  if constexpr (VEC) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (static_cast<int>(threadIdx.x) + k * kThreads) * 4;
      if (c < cols) {
        *reinterpret_cast<float4*>(dst + c) =
            make_float4(v[4 * k + 0], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < VPT * 4; ++j) {
      const int c = static_cast<int>(threadIdx.x) + j * kThreads;
      if (c < cols) dst[c] = v[j];
    }
  }
}

// ---- kernels ----------------------------------------------------------------------------------------

template <int VPT, bool VEC>
__global__ void __launch_bounds__(kThreads, 2)
rms_fwd_kernel(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
               float* __restrict__ rstd_out, int cols, float eps) {
  __shared__ float red[kWarps];
  const int64_t row = blockIdx.x;
  const int64_t off = row * cols;
  float v[VPT * 4];
  load_row<VPT, VEC>(x + off, cols, v, 0.0f);  // padding 0 adds nothing to the sum of squares
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT * 4; ++j) ss += v[j] * v[j];
  const float ms = block_sum(ss, red) / static_cast<float>(cols);
  const float rstd = rsqrtf(ms + eps);
  if (threadIdx.x == 0) rstd_out[row] = rstd;
  // y = x * rstd * w; w is loaded next to each store (fewer live registers).
  float* __restrict__ yr = y + off;
  if constexpr (VEC) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (static_cast<int>(threadIdx.x) + k * kThreads) * 4;
      if (c < cols) {
        const float4 w4 = *reinterpret_cast<const float4*>(w + c);
        float4 o;
        o.x = v[4 * k + 0] * rstd * w4.x;
        o.y = v[4 * k + 1] * rstd * w4.y;
        o.z = v[4 * k + 2] * rstd * w4.z;
        o.w = v[4 * k + 3] * rstd * w4.w;
        *reinterpret_cast<float4*>(yr + c) = o;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < VPT * 4; ++j) {
      const int c = static_cast<int>(threadIdx.x) + j * kThreads;
      if (c < cols) yr[c] = v[j] * rstd * w[c];
    }
  }
}

template <int VPT, bool VEC>
__global__ void __launch_bounds__(kThreads)
rms_bwd_input_kernel(const float* __restrict__ g, const float* __restrict__ x,
                     const float* __restrict__ w, const float* __restrict__ rstd_in,
                     float* __restrict__ dx, int cols) {
  __shared__ float red[kWarps];
  const int64_t row = blockIdx.x;
  const int64_t off = row * cols;
  const float r = rstd_in[row];
  float xv[VPT * 4];
  float gv[VPT * 4];
  float wv[VPT * 4];
  load_row<VPT, VEC>(x + off, cols, xv, 0.0f);
  load_row<VPT, VEC>(g + off, cols, gv, 0.0f);
  load_row<VPT, VEC>(w, cols, wv, 0.0f);
  float d = 0.0f;  // sum g * w * x; padding is 0
#pragma unroll
  for (int j = 0; j < VPT * 4; ++j) {
    gv[j] *= wv[j];
    d += gv[j] * xv[j];
  }
  d = block_sum(d, red);
  const float c = r * r * r * d / static_cast<float>(cols);
#pragma unroll
  for (int j = 0; j < VPT * 4; ++j) xv[j] = r * gv[j] - xv[j] * c;
  store_row<VPT, VEC>(dx + off, cols, xv);
}

// Stage 1 of dw: block (blockIdx.x, blockIdx.y) sums columns [32 * bx, 32 * bx + 32) over rows
// [128 * by, 128 * by + 128); thread (tx, ty) takes rows ty, ty + 8, ...; the 8 row-partials of a
// column are then added in a fixed order. Writes part_w[by * cols + column].
__global__ void __launch_bounds__(kColTile * kRowThreads)
rms_bwd_weight_partial_kernel(const float* __restrict__ g, const float* __restrict__ x,
                              const float* __restrict__ rstd_in, float* __restrict__ part_w,
                              int64_t rows, int cols) {
  __shared__ float s_w[kRowThreads][kColTile + 1];
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int col = blockIdx.x * kColTile + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
  float aw = 0.0f;
  if (col < cols) {
    for (int64_t r = r0 + ty; r < r1; r += kRowThreads) {
      const int64_t i = r * cols + col;
      aw += g[i] * x[i];  // BUG (planted): should be g * (x * rstd[r])
    }
  }
  s_w[ty][tx] = aw;
  __syncthreads();
  if (ty == 0 && col < cols) {
    float tw = 0.0f;
#pragma unroll
    for (int k = 0; k < kRowThreads; ++k) tw += s_w[k][tx];
    part_w[static_cast<int64_t>(blockIdx.y) * cols + col] = tw;
  }
}

// Stage 2: one thread per column adds the chunk partials in chunk order.
__global__ void __launch_bounds__(kFinalThreads)
rms_bwd_weight_final_kernel(const float* __restrict__ part_w, float* __restrict__ dw, int chunks,
                            int cols) {
  const int col = blockIdx.x * kFinalThreads + threadIdx.x;
  if (col >= cols) return;
  float tw = 0.0f;
  for (int k = 0; k < chunks; ++k) tw += part_w[static_cast<int64_t>(k) * cols + col];
  dw[col] = tw;
}

// ---- host side ----------------------------------------------------------------------------------------

void check_f32_cuda(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32");
}

bool aligned16(const torch::Tensor& t) {
  return reinterpret_cast<std::uintptr_t>(t.data_ptr<float>()) % 16 == 0;
}

// Smallest VPT in {1, 2, 4, 8} with VPT * 4 * kThreads >= cols.
int pick_vpt(int64_t cols) {
  int vpt = 1;
  while (static_cast<int64_t>(vpt) * 4 * kThreads < cols) vpt *= 2;
  return vpt;
}

void check_rows(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(x.dim() == 2, "expected a 2-D (rows, cols) input");
  TORCH_CHECK(x.size(1) <= static_cast<int64_t>(kThreads) * kMaxVecPerThread * 4,
              "rows longer than ", kThreads * kMaxVecPerThread * 4, " elements are not supported");
  TORCH_CHECK(x.size(0) <= INT32_MAX, "too many rows for a 1-D grid");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(1), "weight must have cols elements");
  TORCH_CHECK(w.device() == x.device(), "all tensors must be on the same device");
}

template <int VPT>
void launch_fwd_vpt(bool vec, unsigned blocks, cudaStream_t stream, const float* x, const float* w,
                    float* y, float* rstd, int cols, float eps) {
  if (vec) {
    rms_fwd_kernel<VPT, true><<<blocks, kThreads, 0, stream>>>(x, w, y, rstd, cols, eps);
  } else {
    rms_fwd_kernel<VPT, false><<<blocks, kThreads, 0, stream>>>(x, w, y, rstd, cols, eps);
  }
}

void launch_fwd(int vpt, bool vec, unsigned blocks, cudaStream_t stream, const float* x,
                const float* w, float* y, float* rstd, int cols, float eps) {
  switch (vpt) {
    case 1: launch_fwd_vpt<1>(vec, blocks, stream, x, w, y, rstd, cols, eps); break;
    case 2: launch_fwd_vpt<2>(vec, blocks, stream, x, w, y, rstd, cols, eps); break;
    case 4: launch_fwd_vpt<4>(vec, blocks, stream, x, w, y, rstd, cols, eps); break;
    default: launch_fwd_vpt<8>(vec, blocks, stream, x, w, y, rstd, cols, eps); break;
  }
}

template <int VPT>
void launch_bwd_input_vpt(bool vec, unsigned blocks, cudaStream_t stream, const float* g,
                          const float* x, const float* w, const float* rstd, float* dx, int cols) {
  if (vec) {
    rms_bwd_input_kernel<VPT, true><<<blocks, kThreads, 0, stream>>>(g, x, w, rstd, dx, cols);
  } else {
    rms_bwd_input_kernel<VPT, false><<<blocks, kThreads, 0, stream>>>(g, x, w, rstd, dx, cols);
  }
}

void launch_bwd_input(int vpt, bool vec, unsigned blocks, cudaStream_t stream, const float* g,
                      const float* x, const float* w, const float* rstd, float* dx, int cols) {
  switch (vpt) {
    case 1: launch_bwd_input_vpt<1>(vec, blocks, stream, g, x, w, rstd, dx, cols); break;
    case 2: launch_bwd_input_vpt<2>(vec, blocks, stream, g, x, w, rstd, dx, cols); break;
    case 4: launch_bwd_input_vpt<4>(vec, blocks, stream, g, x, w, rstd, dx, cols); break;
    default: launch_bwd_input_vpt<8>(vec, blocks, stream, g, x, w, rstd, dx, cols); break;
  }
}

}  // namespace

std::vector<torch::Tensor> rmsnorm_forward(torch::Tensor x, torch::Tensor weight, double eps) {
  check_f32_cuda(x, "x");
  check_f32_cuda(weight, "weight");
  check_rows(x, weight);
  const c10::cuda::CUDAGuard device_guard(x.device());
  const int64_t rows = x.size(0);
  const int cols = static_cast<int>(x.size(1));
  auto y = torch::empty_like(x);
  auto rstd = torch::empty({rows}, x.options());
  if (rows == 0 || cols == 0) return {y, rstd};
  const bool vec = cols % 4 == 0 && aligned16(x) && aligned16(weight) && aligned16(y);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  launch_fwd(pick_vpt(cols), vec, static_cast<unsigned>(rows), stream, x.data_ptr<float>(),
             weight.data_ptr<float>(), y.data_ptr<float>(), rstd.data_ptr<float>(), cols,
             static_cast<float>(eps));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {y, rstd};
}

std::vector<torch::Tensor> rmsnorm_backward(torch::Tensor grad_y, torch::Tensor x,
                                            torch::Tensor weight, torch::Tensor rstd) {
  check_f32_cuda(grad_y, "grad_y");
  check_f32_cuda(x, "x");
  check_f32_cuda(weight, "weight");
  check_f32_cuda(rstd, "rstd");
  check_rows(x, weight);
  TORCH_CHECK(grad_y.sizes() == x.sizes(), "grad_y must have the shape of x");
  TORCH_CHECK(rstd.numel() == x.size(0), "rstd: one per row");
  const c10::cuda::CUDAGuard device_guard(x.device());
  const int64_t rows = x.size(0);
  const int cols = static_cast<int>(x.size(1));
  auto dx = torch::empty_like(x);
  auto dw = torch::zeros_like(weight);
  if (rows == 0 || cols == 0) return {dx, dw};
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  const bool vec = cols % 4 == 0 && aligned16(x) && aligned16(grad_y) && aligned16(weight) && aligned16(dx);
  launch_bwd_input(pick_vpt(cols), vec, static_cast<unsigned>(rows), stream,
                   grad_y.data_ptr<float>(), x.data_ptr<float>(), weight.data_ptr<float>(),
                   rstd.data_ptr<float>(), dx.data_ptr<float>(), cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  TORCH_CHECK(chunks <= 65535, "too many rows for the weight-gradient grid");
  auto part_w = torch::empty({chunks, cols}, x.options());
  const dim3 grid1((cols + kColTile - 1) / kColTile, static_cast<unsigned>(chunks));
  const dim3 block1(kColTile, kRowThreads);
  rms_bwd_weight_partial_kernel<<<grid1, block1, 0, stream>>>(
      grad_y.data_ptr<float>(), x.data_ptr<float>(), rstd.data_ptr<float>(),
      part_w.data_ptr<float>(), rows, cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  rms_bwd_weight_final_kernel<<<(cols + kFinalThreads - 1) / kFinalThreads, kFinalThreads, 0, stream>>>(
      part_w.data_ptr<float>(), dw.data_ptr<float>(), static_cast<int>(chunks), cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {dx, dw};
}
"""

rmsnorm_ext = load_inline(
    name="ctl_rmsnorm_rows_dw",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["rmsnorm_forward", "rmsnorm_backward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class RMSNormFunction(torch.autograd.Function):
    """RMSNorm over the last dimension of a 2-D (rows, hidden) tensor."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        x = x.contiguous()
        weight = weight.contiguous()
        y, rstd = rmsnorm_ext.rmsnorm_forward(x, weight, eps)
        ctx.save_for_backward(x, weight, rstd)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, rstd = ctx.saved_tensors
        dx, dw = rmsnorm_ext.rmsnorm_backward(grad_y.contiguous(), x, weight, rstd)
        return dx, dw, None


class ModelNew(nn.Module):
    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.eps = eps
        # Same name, shape and initialisation as the reference; the reference's value is loaded
        # over it by name anyway.
        self.weight = nn.Parameter(torch.ones(hidden) + 0.1 * torch.randn(hidden))

    def forward(self, x):
        hidden = self.weight.numel()
        y = RMSNormFunction.apply(x.reshape(-1, hidden), self.weight, self.eps)
        return y.reshape(x.shape)
