# expected: incorrect
# Planted defect: the forward normalises with a hard-coded eps of 1e-3 instead of the module's
# self.ln.eps = 1e-5 (the Python wrapper passes LN_EPS below). Everything else is the same as
# correct_cuda.py. The inputs are randn * 2 + 0.5, so each row's variance is about 4 and
# rstd = 1 / sqrt(var + eps) moves by about (1e-3 - 1e-5) / (2 * 4) = 1.24e-4 relative. With
# weight 1 and bias 0 the output error is |y| * 1.24e-4 against a tolerance of 1e-4 + 1e-4 * |y|,
# so every element with |y| > ~4.2 fails: float64 emulation of the harness's five trials (seed 42)
# against the fp32 reference puts 7.4k to 7.7k elements of each trial out of tolerance, the worst
# 5e-5 beyond it, while fp32 rounding moves outputs by ~1e-6: `incorrect`.
# A careless judge with a loose tolerance, or one that compares only a few elements, passes it.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

// Returns {y, mean, rstd}; mean and rstd have one entry per row.
std::vector<torch::Tensor> layernorm_forward(torch::Tensor x, torch::Tensor weight,
                                             torch::Tensor bias, double eps);
// Returns {grad_x, grad_weight, grad_bias}.
std::vector<torch::Tensor> layernorm_backward(torch::Tensor grad_y, torch::Tensor x,
                                              torch::Tensor weight, torch::Tensor mean,
                                              torch::Tensor rstd);
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

// Parameter-gradient reduction: (32, 8) blocks, each summing 32 columns over 128 rows.
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
ln_fwd_kernel(const float* __restrict__ x, const float* __restrict__ w, const float* __restrict__ b,
              float* __restrict__ y, float* __restrict__ mean_out, float* __restrict__ rstd_out,
              int cols, float eps) {
  __shared__ float red_mean[kWarps];
  __shared__ float red_var[kWarps];
  const int64_t row = blockIdx.x;
  const int64_t off = row * cols;
  float v[VPT * 4];
  load_row<VPT, VEC>(x + off, cols, v, 0.0f);  // padding 0 adds nothing to the sum

  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT * 4; ++j) s += v[j];
  const float inv_n = 1.0f / static_cast<float>(cols);
  const float mean = block_sum(s, red_mean) * inv_n;

  float q = 0.0f;
#pragma unroll
  for (int j = 0; j < VPT * 4; ++j) {
    const float d = v[j] - mean;
    q += (col_of<VEC>(j) < cols) ? d * d : 0.0f;
  }
  const float var = block_sum(q, red_var) * inv_n;
  const float rstd = rsqrtf(var + eps);
  if (threadIdx.x == 0) {
    mean_out[row] = mean;
    rstd_out[row] = rstd;
  }

  // y = (x - mean) * rstd * w + b; w and b are loaded next to each store (fewer live registers).
  float* __restrict__ yr = y + off;
  if constexpr (VEC) {
#pragma unroll
    for (int k = 0; k < VPT; ++k) {
      const int c = (static_cast<int>(threadIdx.x) + k * kThreads) * 4;
      if (c < cols) {
        const float4 w4 = *reinterpret_cast<const float4*>(w + c);
        const float4 b4 = *reinterpret_cast<const float4*>(b + c);
        float4 o;
        o.x = (v[4 * k + 0] - mean) * rstd * w4.x + b4.x;
        o.y = (v[4 * k + 1] - mean) * rstd * w4.y + b4.y;
        o.z = (v[4 * k + 2] - mean) * rstd * w4.z + b4.z;
        o.w = (v[4 * k + 3] - mean) * rstd * w4.w + b4.w;
        *reinterpret_cast<float4*>(yr + c) = o;
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < VPT * 4; ++j) {
      const int c = static_cast<int>(threadIdx.x) + j * kThreads;
      if (c < cols) yr[c] = (v[j] - mean) * rstd * w[c] + b[c];
    }
  }
}

template <int VPT, bool VEC>
__global__ void __launch_bounds__(kThreads)
ln_bwd_input_kernel(const float* __restrict__ g, const float* __restrict__ x,
                    const float* __restrict__ w, const float* __restrict__ mean_in,
                    const float* __restrict__ rstd_in, float* __restrict__ dx, int cols) {
  __shared__ float red_a[kWarps];
  __shared__ float red_b[kWarps];
  const int64_t row = blockIdx.x;
  const int64_t off = row * cols;
  const float mean = mean_in[row];
  const float rstd = rstd_in[row];
  float xv[VPT * 4];
  float gv[VPT * 4];
  float wv[VPT * 4];
  load_row<VPT, VEC>(x + off, cols, xv, 0.0f);
  load_row<VPT, VEC>(g + off, cols, gv, 0.0f);
  load_row<VPT, VEC>(w, cols, wv, 0.0f);

  // xv <- xhat, gv <- dxhat = g * w; padding has g = w = 0, so dxhat = 0 there.
  float a = 0.0f;  // sum dxhat
  float c = 0.0f;  // sum dxhat * xhat
#pragma unroll
  for (int j = 0; j < VPT * 4; ++j) {
    const float xh = (xv[j] - mean) * rstd;
    const float dxh = gv[j] * wv[j];
    xv[j] = xh;
    gv[j] = dxh;
    a += dxh;
    c += dxh * xh;
  }
  const float inv_n = 1.0f / static_cast<float>(cols);
  const float mean_dxh = block_sum(a, red_a) * inv_n;
  const float mean_dxh_xh = block_sum(c, red_b) * inv_n;
#pragma unroll
  for (int j = 0; j < VPT * 4; ++j) xv[j] = rstd * (gv[j] - mean_dxh - xv[j] * mean_dxh_xh);
  store_row<VPT, VEC>(dx + off, cols, xv);
}

// Stage 1 of dw / db: block (blockIdx.x, blockIdx.y) sums columns [32 * bx, 32 * bx + 32) over rows
// [128 * by, 128 * by + 128); thread (tx, ty) takes rows ty, ty + 8, ...; the 8 row-partials of a
// column are then added in a fixed order. Writes part_w / part_b[by * cols + column].
__global__ void __launch_bounds__(kColTile * kRowThreads)
ln_bwd_param_partial_kernel(const float* __restrict__ g, const float* __restrict__ x,
                            const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
                            float* __restrict__ part_w, float* __restrict__ part_b,
                            int64_t rows, int cols) {
  __shared__ float s_w[kRowThreads][kColTile + 1];
  __shared__ float s_b[kRowThreads][kColTile + 1];
  const int tx = threadIdx.x;
  const int ty = threadIdx.y;
  const int col = blockIdx.x * kColTile + tx;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < rows ? r0 + kRowsPerChunk : rows;
  float aw = 0.0f;
  float ab = 0.0f;
  if (col < cols) {
    for (int64_t r = r0 + ty; r < r1; r += kRowThreads) {
      const int64_t i = r * cols + col;
      const float gv = g[i];
      const float xh = (x[i] - mean_in[r]) * rstd_in[r];
      aw += gv * xh;
      ab += gv;
    }
  }
  s_w[ty][tx] = aw;
  s_b[ty][tx] = ab;
  __syncthreads();
  if (ty == 0 && col < cols) {
    float tw = 0.0f;
    float tb = 0.0f;
#pragma unroll
    for (int k = 0; k < kRowThreads; ++k) {
      tw += s_w[k][tx];
      tb += s_b[k][tx];
    }
    const int64_t o = static_cast<int64_t>(blockIdx.y) * cols + col;
    part_w[o] = tw;
    part_b[o] = tb;
  }
}

// Stage 2: one thread per column adds the chunk partials in chunk order.
__global__ void __launch_bounds__(kFinalThreads)
ln_bwd_param_final_kernel(const float* __restrict__ part_w, const float* __restrict__ part_b,
                          float* __restrict__ dw, float* __restrict__ db, int chunks, int cols) {
  const int col = blockIdx.x * kFinalThreads + threadIdx.x;
  if (col >= cols) return;
  float tw = 0.0f;
  float tb = 0.0f;
  for (int k = 0; k < chunks; ++k) {
    const int64_t o = static_cast<int64_t>(k) * cols + col;
    tw += part_w[o];
    tb += part_b[o];
  }
  dw[col] = tw;
  db[col] = tb;
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
                    const float* b, float* y, float* mean, float* rstd, int cols, float eps) {
  if (vec) {
    ln_fwd_kernel<VPT, true><<<blocks, kThreads, 0, stream>>>(x, w, b, y, mean, rstd, cols, eps);
  } else {
    ln_fwd_kernel<VPT, false><<<blocks, kThreads, 0, stream>>>(x, w, b, y, mean, rstd, cols, eps);
  }
}

void launch_fwd(int vpt, bool vec, unsigned blocks, cudaStream_t stream, const float* x,
                const float* w, const float* b, float* y, float* mean, float* rstd, int cols,
                float eps) {
  switch (vpt) {
    case 1: launch_fwd_vpt<1>(vec, blocks, stream, x, w, b, y, mean, rstd, cols, eps); break;
    case 2: launch_fwd_vpt<2>(vec, blocks, stream, x, w, b, y, mean, rstd, cols, eps); break;
    case 4: launch_fwd_vpt<4>(vec, blocks, stream, x, w, b, y, mean, rstd, cols, eps); break;
    default: launch_fwd_vpt<8>(vec, blocks, stream, x, w, b, y, mean, rstd, cols, eps); break;
  }
}

template <int VPT>
void launch_bwd_input_vpt(bool vec, unsigned blocks, cudaStream_t stream, const float* g,
                          const float* x, const float* w, const float* mean, const float* rstd,
                          float* dx, int cols) {
  if (vec) {
    ln_bwd_input_kernel<VPT, true><<<blocks, kThreads, 0, stream>>>(g, x, w, mean, rstd, dx, cols);
  } else {
    ln_bwd_input_kernel<VPT, false><<<blocks, kThreads, 0, stream>>>(g, x, w, mean, rstd, dx, cols);
  }
}

void launch_bwd_input(int vpt, bool vec, unsigned blocks, cudaStream_t stream, const float* g,
                      const float* x, const float* w, const float* mean, const float* rstd,
                      float* dx, int cols) {
  switch (vpt) {
    case 1: launch_bwd_input_vpt<1>(vec, blocks, stream, g, x, w, mean, rstd, dx, cols); break;
    case 2: launch_bwd_input_vpt<2>(vec, blocks, stream, g, x, w, mean, rstd, dx, cols); break;
    case 4: launch_bwd_input_vpt<4>(vec, blocks, stream, g, x, w, mean, rstd, dx, cols); break;
    default: launch_bwd_input_vpt<8>(vec, blocks, stream, g, x, w, mean, rstd, dx, cols); break;
  }
}

}  // namespace

std::vector<torch::Tensor> layernorm_forward(torch::Tensor x, torch::Tensor weight,
                                             torch::Tensor bias, double eps) {
  check_f32_cuda(x, "x");
  check_f32_cuda(weight, "weight");
  check_f32_cuda(bias, "bias");
  check_rows(x, weight);
  check_rows(x, bias);
  const c10::cuda::CUDAGuard device_guard(x.device());
  const int64_t rows = x.size(0);
  const int cols = static_cast<int>(x.size(1));
  auto y = torch::empty_like(x);
  auto mean = torch::empty({rows}, x.options());
  auto rstd = torch::empty({rows}, x.options());
  if (rows == 0 || cols == 0) return {y, mean, rstd};
  const bool vec = cols % 4 == 0 && aligned16(x) && aligned16(weight) && aligned16(bias) && aligned16(y);
  const int vpt = pick_vpt(cols);
  const unsigned blocks = static_cast<unsigned>(rows);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  launch_fwd(vpt, vec, blocks, stream, x.data_ptr<float>(), weight.data_ptr<float>(),
             bias.data_ptr<float>(), y.data_ptr<float>(), mean.data_ptr<float>(),
             rstd.data_ptr<float>(), cols, static_cast<float>(eps));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {y, mean, rstd};
}

std::vector<torch::Tensor> layernorm_backward(torch::Tensor grad_y, torch::Tensor x,
                                              torch::Tensor weight, torch::Tensor mean,
                                              torch::Tensor rstd) {
  check_f32_cuda(grad_y, "grad_y");
  check_f32_cuda(x, "x");
  check_f32_cuda(weight, "weight");
  check_f32_cuda(mean, "mean");
  check_f32_cuda(rstd, "rstd");
  check_rows(x, weight);
  TORCH_CHECK(grad_y.sizes() == x.sizes(), "grad_y must have the shape of x");
  TORCH_CHECK(mean.numel() == x.size(0) && rstd.numel() == x.size(0), "mean/rstd: one per row");
  const c10::cuda::CUDAGuard device_guard(x.device());
  const int64_t rows = x.size(0);
  const int cols = static_cast<int>(x.size(1));
  auto dx = torch::empty_like(x);
  auto dw = torch::zeros_like(weight);
  auto db = torch::zeros_like(weight);
  if (rows == 0 || cols == 0) return {dx, dw, db};
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();

  const bool vec = cols % 4 == 0 && aligned16(x) && aligned16(grad_y) && aligned16(weight) && aligned16(dx);
  const int vpt = pick_vpt(cols);
  const unsigned blocks = static_cast<unsigned>(rows);
  launch_bwd_input(vpt, vec, blocks, stream, grad_y.data_ptr<float>(), x.data_ptr<float>(),
                   weight.data_ptr<float>(), mean.data_ptr<float>(), rstd.data_ptr<float>(),
                   dx.data_ptr<float>(), cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  TORCH_CHECK(chunks <= 65535, "too many rows for the parameter-gradient grid");
  auto part_w = torch::empty({chunks, cols}, x.options());
  auto part_b = torch::empty({chunks, cols}, x.options());
  const dim3 grid1((cols + kColTile - 1) / kColTile, static_cast<unsigned>(chunks));
  const dim3 block1(kColTile, kRowThreads);
  ln_bwd_param_partial_kernel<<<grid1, block1, 0, stream>>>(
      grad_y.data_ptr<float>(), x.data_ptr<float>(), mean.data_ptr<float>(), rstd.data_ptr<float>(),
      part_w.data_ptr<float>(), part_b.data_ptr<float>(), rows, cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  ln_bwd_param_final_kernel<<<(cols + kFinalThreads - 1) / kFinalThreads, kFinalThreads, 0, stream>>>(
      part_w.data_ptr<float>(), part_b.data_ptr<float>(), dw.data_ptr<float>(), db.data_ptr<float>(),
      static_cast<int>(chunks), cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {dx, dw, db};
}
"""

layernorm_ext = load_inline(
    name="ctl_layernorm_rows_eps",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["layernorm_forward", "layernorm_backward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


LN_EPS = 1e-3


class LayerNormFunction(torch.autograd.Function):
    """LayerNorm over the last dimension of a 2-D (rows, hidden) tensor."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        x = x.contiguous()
        weight = weight.contiguous()
        bias = bias.contiguous()
        # BUG (planted): the module's eps is ignored and LN_EPS = 1e-3 is used instead.
        y, mean, rstd = layernorm_ext.layernorm_forward(x, weight, bias, LN_EPS)
        ctx.save_for_backward(x, weight, mean, rstd)
        return y

    @staticmethod
    def backward(ctx, grad_y):
        x, weight, mean, rstd = ctx.saved_tensors
        dx, dw, db = layernorm_ext.layernorm_backward(grad_y.contiguous(), x, weight, mean, rstd)
        return dx, dw, db, None


class ModelNew(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        # Same submodule name and eps as the reference: ln.weight / ln.bias load by name.
        self.ln = nn.LayerNorm(hidden, eps=1e-5)

    def forward(self, x):
        hidden = self.ln.weight.numel()
        y = LayerNormFunction.apply(x.reshape(-1, hidden), self.ln.weight, self.ln.bias, self.ln.eps)
        return y.reshape(x.shape)
