# expected: pass
# Row softmax (dim 1 of a 2-D fp32 tensor) with hand-written CUDA forward and backward kernels,
# wired through torch.autograd.Function.
#
# Forward: one 512-thread block per row. The row is loaded once into registers (float4 loads when
# the row length is a multiple of 4 and both pointers are 16-byte aligned, scalar loads otherwise),
# each thread computes a local max m_t and a local sum s_t = sum exp(x - m_t) over its own elements,
# and ONE block reduction combines the (m, s) pairs: M = max(m1, m2), s = s1 * exp(m1 - M) +
# s2 * exp(m2 - M) (warp shuffles, then the per-warp partials through shared memory with a
# __syncthreads() between writing and reading them). Output y = exp(x - m_t) * (exp(m_t - M) / S),
# i.e. exp(x - M) / S with the row max subtracted. x is read once, y written once.
# Backward: dx = y * (g - sum(g * y)), one block per row, the same register-resident row and a
# block sum.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor softmax_forward(torch::Tensor x);
torch::Tensor softmax_backward(torch::Tensor y, torch::Tensor grad_y);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cmath>
#include <cstdint>

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kThreads = 512;                 // 16 warps per block, one block per row
constexpr int kWarps = kThreads / 32;
constexpr int kMaxVecPerThread = 8;           // row capacity: 512 * 8 * 4 = 16384 floats

// ---- block reductions --------------------------------------------------------------------------
// xor butterflies: every lane ends with the same bits (the combine steps are commutative), so every
// thread of the block gets the identical total.

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFullMask, v, o);
  return v;
}

// Combine two (max, sum-of-exp relative to max) pairs. An empty pair is (-inf, 0).
__device__ __forceinline__ void ms_combine(float& m, float& s, float m2, float s2) {
  const float mn = fmaxf(m, m2);
  const float f1 = (m == -INFINITY) ? 0.0f : expf(m - mn);
  const float f2 = (m2 == -INFINITY) ? 0.0f : expf(m2 - mn);
  s = s * f1 + s2 * f2;
  m = mn;
}

__device__ __forceinline__ void warp_max_sum(float& m, float& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float m2 = __shfl_xor_sync(kFullMask, m, o);
    const float s2 = __shfl_xor_sync(kFullMask, s, o);
    ms_combine(m, s, m2, s2);
  }
}

// Block-wide (max, sum) combine. red_m / red_s (kWarps floats each) are used by this reduction only.
__device__ __forceinline__ void block_max_sum(float& m, float& s, float* red_m, float* red_s) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  warp_max_sum(m, s);
  if (lane == 0) {
    red_m[warp] = m;
    red_s[warp] = s;
  }
  __syncthreads();  // every warp's partial is written before any warp reads them
  m = lane < kWarps ? red_m[lane] : -INFINITY;
  s = lane < kWarps ? red_s[lane] : 0.0f;
  warp_max_sum(m, s);
}

// Block-wide sum; red (kWarps floats) is used by this reduction only.
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
// A thread holds VPT * 4 elements. VEC: float4 slot k is vector (tid + k * kThreads), element j is
// column 4 * (tid + (j / 4) * kThreads) + j % 4 (needs cols % 4 == 0 and 16-byte aligned rows).
// Scalar: element j is column tid + j * kThreads. Either way: valid iff column < cols.

template <bool VEC>
__device__ __forceinline__ int col_of(int j) {
  const int tid = static_cast<int>(threadIdx.x);
  return VEC ? (tid + (j >> 2) * kThreads) * 4 + (j & 3) : tid + j * kThreads;
}

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
softmax_fwd_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
  __shared__ float red_m[kWarps];
  __shared__ float red_s[kWarps];
  const int64_t off = static_cast<int64_t>(blockIdx.x) * cols;
  float v[VPT * 4];
  load_row<VPT, VEC>(x + off, cols, v, -INFINITY);

  // Thread-local max and sum of exp(x - local max); padding (-inf) contributes exp(-inf) = 0.
  float m = -INFINITY;
#pragma unroll
  for (int j = 0; j < VPT * 4; ++j) m = fmaxf(m, v[j]);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT * 4; ++j) {
    const float e = (col_of<VEC>(j) < cols) ? expf(v[j] - m) : 0.0f;
    v[j] = e;
    s += e;
  }

  float row_m = m;
  float row_s = s;
  block_max_sum(row_m, row_s, red_m, red_s);
  // exp(x - M) / S = exp(x - m) * (exp(m - M) / S); a thread with no valid element has m = -inf
  // and writes nothing.
  const float scale = (m == -INFINITY) ? 0.0f : expf(m - row_m) / row_s;
#pragma unroll
  for (int j = 0; j < VPT * 4; ++j) v[j] *= scale;
  store_row<VPT, VEC>(y + off, cols, v);
}

template <int VPT, bool VEC>
__global__ void __launch_bounds__(kThreads)
softmax_bwd_kernel(const float* __restrict__ y, const float* __restrict__ g,
                   float* __restrict__ dx, int cols) {
  __shared__ float red[kWarps];
  const int64_t off = static_cast<int64_t>(blockIdx.x) * cols;
  float yv[VPT * 4];
  float gv[VPT * 4];
  load_row<VPT, VEC>(y + off, cols, yv, 0.0f);
  load_row<VPT, VEC>(g + off, cols, gv, 0.0f);
  float d = 0.0f;  // padding is 0 * 0
#pragma unroll
  for (int j = 0; j < VPT * 4; ++j) d += yv[j] * gv[j];
  d = block_sum(d, red);
#pragma unroll
  for (int j = 0; j < VPT * 4; ++j) yv[j] = yv[j] * (gv[j] - d);
  store_row<VPT, VEC>(dx + off, cols, yv);
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

void check_2d(const torch::Tensor& t) {
  TORCH_CHECK(t.dim() == 2, "expected a 2-D (rows, cols) tensor");
  TORCH_CHECK(t.size(1) <= static_cast<int64_t>(kThreads) * kMaxVecPerThread * 4,
              "rows longer than ", kThreads * kMaxVecPerThread * 4, " elements are not supported");
  TORCH_CHECK(t.size(0) <= INT32_MAX, "too many rows for a 1-D grid");
}

template <bool VEC>
void launch_fwd(int vpt, unsigned blocks, cudaStream_t stream, const float* x, float* y, int cols) {
  switch (vpt) {
    case 1: softmax_fwd_kernel<1, VEC><<<blocks, kThreads, 0, stream>>>(x, y, cols); break;
    case 2: softmax_fwd_kernel<2, VEC><<<blocks, kThreads, 0, stream>>>(x, y, cols); break;
    case 4: softmax_fwd_kernel<4, VEC><<<blocks, kThreads, 0, stream>>>(x, y, cols); break;
    default: softmax_fwd_kernel<8, VEC><<<blocks, kThreads, 0, stream>>>(x, y, cols); break;
  }
}

template <bool VEC>
void launch_bwd(int vpt, unsigned blocks, cudaStream_t stream, const float* y, const float* g,
                float* dx, int cols) {
  switch (vpt) {
    case 1: softmax_bwd_kernel<1, VEC><<<blocks, kThreads, 0, stream>>>(y, g, dx, cols); break;
    case 2: softmax_bwd_kernel<2, VEC><<<blocks, kThreads, 0, stream>>>(y, g, dx, cols); break;
    case 4: softmax_bwd_kernel<4, VEC><<<blocks, kThreads, 0, stream>>>(y, g, dx, cols); break;
    default: softmax_bwd_kernel<8, VEC><<<blocks, kThreads, 0, stream>>>(y, g, dx, cols); break;
  }
}

}  // namespace

torch::Tensor softmax_forward(torch::Tensor x) {
  check_f32_cuda(x, "x");
  check_2d(x);
  const c10::cuda::CUDAGuard device_guard(x.device());
  auto y = torch::empty_like(x);
  const int64_t rows = x.size(0);
  const int cols = static_cast<int>(x.size(1));
  if (rows == 0 || cols == 0) return y;
  const bool vec = cols % 4 == 0 && aligned16(x) && aligned16(y);
  const int vpt = pick_vpt(cols);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (vec) {
    launch_fwd<true>(vpt, static_cast<unsigned>(rows), stream, x.data_ptr<float>(), y.data_ptr<float>(), cols);
  } else {
    launch_fwd<false>(vpt, static_cast<unsigned>(rows), stream, x.data_ptr<float>(), y.data_ptr<float>(), cols);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return y;
}

torch::Tensor softmax_backward(torch::Tensor y, torch::Tensor grad_y) {
  check_f32_cuda(y, "y");
  check_f32_cuda(grad_y, "grad_y");
  check_2d(y);
  TORCH_CHECK(grad_y.sizes() == y.sizes(), "grad_y must have the shape of y");
  TORCH_CHECK(grad_y.device() == y.device(), "y and grad_y must be on the same device");
  const c10::cuda::CUDAGuard device_guard(y.device());
  auto dx = torch::empty_like(y);
  const int64_t rows = y.size(0);
  const int cols = static_cast<int>(y.size(1));
  if (rows == 0 || cols == 0) return dx;
  const bool vec = cols % 4 == 0 && aligned16(y) && aligned16(grad_y) && aligned16(dx);
  const int vpt = pick_vpt(cols);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (vec) {
    launch_bwd<true>(vpt, static_cast<unsigned>(rows), stream, y.data_ptr<float>(),
                     grad_y.data_ptr<float>(), dx.data_ptr<float>(), cols);
  } else {
    launch_bwd<false>(vpt, static_cast<unsigned>(rows), stream, y.data_ptr<float>(),
                      grad_y.data_ptr<float>(), dx.data_ptr<float>(), cols);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return dx;
}
"""

softmax_ext = load_inline(
    name="ctl_softmax_rows",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["softmax_forward", "softmax_backward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class RowSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = softmax_ext.softmax_forward(x.contiguous())
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        (y,) = ctx.saved_tensors
        return softmax_ext.softmax_backward(y, grad_y.contiguous())


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        assert x.dim() == 2, "this kernel implements softmax over dim 1 of a 2-D tensor"
        return RowSoftmax.apply(x)
