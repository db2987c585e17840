# expected: incorrect
# Planted defect: the forward kernel has no scalar tail. Everything else is the same as
# correct_cuda.py: the tensor is processed as rows of its last dimension (16381, odd), each row as
# a scalar head up to the first 16-byte boundary plus a float4 body of floor((cols - head) / 4)
# vectors, but the loop over the last (cols - head) % 4 elements of the row is missing. With
# cols = 16381 that leaves 1, 2, 3 or 0 elements unwritten in rows r % 4 = 0, 1, 2, 3 (24576 of
# the 268 million outputs per trial): they keep whatever torch::empty handed back (zeros, stale
# values of an earlier trial, or garbage), so the trials are out of tolerance: `incorrect`.
# Note: the defect has to live in a per-row loop. Over the flat tensor there is no tail to miss,
# since 16384 * 16381 = 2^14 * 16381 is a multiple of 4 (and of every power of two up to 2^14).
# The backward (gelu_backward) still does its tail and is correct.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

torch::Tensor gelu_forward(torch::Tensor x);
torch::Tensor gelu_backward(torch::Tensor x, torch::Tensor grad_y);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cstdint>

namespace {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;                           // float4 per thread
constexpr int kVecPerBlock = kThreads * kUnroll;     // 1024 float4 = 4096 floats per block
constexpr float kSqrtHalf = 0.70710678118654752440f;   // 1 / sqrt(2)
constexpr float kInvSqrt2Pi = 0.39894228040143267794f; // 1 / sqrt(2 pi)

__device__ __forceinline__ float gelu_value(float x) {
  return x * 0.5f * (1.0f + erff(x * kSqrtHalf));
}

__device__ __forceinline__ float gelu_grad(float x, float dy) {
  const float cdf = 0.5f * (1.0f + erff(x * kSqrtHalf));
  const float pdf = expf(-0.5f * x * x) * kInvSqrt2Pi;
  return dy * (cdf + x * pdf);
}

template <bool BWD>
__device__ __forceinline__ float gelu_op(float x, float dy) {
  if constexpr (BWD) {
    return gelu_grad(x, dy);
  } else {
    return gelu_value(x);
  }
}

// Forward: out = gelu(x) (g unused, may be null). Backward: out = gelu'(x) * g.
// Block b handles row b / chunks, float4 range [chunk * kVecPerBlock, (chunk + 1) * kVecPerBlock)
// of that row's body. All base pointers are 16-byte aligned (checked on the host), so the body,
// which starts at an element index that is a multiple of 4, is float4-aligned in every tensor.
template <bool BWD>
__global__ void __launch_bounds__(kThreads)
gelu_rows_kernel(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ out,
                 int64_t cols, int64_t chunks) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) / chunks;
  const int64_t chunk = static_cast<int64_t>(blockIdx.x) - row * chunks;
  const int64_t start = row * cols;                   // first element of the row
  const int64_t head_full = (4 - start % 4) % 4;      // elements before the first aligned one
  const int64_t head = head_full < cols ? head_full : cols;
  const int64_t nvec = (cols - head) / 4;             // float4 in the body
  const int64_t body = start + head;                  // a multiple of 4 (or the row is all head)
  const int64_t tail_begin = head + nvec * 4;         // column of the first tail element
  const int tid = static_cast<int>(threadIdx.x);

  const float4* xv = reinterpret_cast<const float4*>(x + body);
  const float4* gv = reinterpret_cast<const float4*>(BWD ? g + body : x + body);
  float4* ov = reinterpret_cast<float4*>(out + body);
  float4 a[kUnroll];
  float4 b[kUnroll];
  const int64_t v0 = chunk * kVecPerBlock + tid;
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = v0 + static_cast<int64_t>(u) * kThreads;
    a[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    b[u] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if (i < nvec) {
      a[u] = xv[i];
      if (BWD) b[u] = gv[i];
    }
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = v0 + static_cast<int64_t>(u) * kThreads;
    if (i < nvec) {
      float4 r;
      r.x = gelu_op<BWD>(a[u].x, b[u].x);
      r.y = gelu_op<BWD>(a[u].y, b[u].y);
      r.z = gelu_op<BWD>(a[u].z, b[u].z);
      r.w = gelu_op<BWD>(a[u].w, b[u].w);
      ov[i] = r;
    }
  }

  // Scalar head: columns [0, head), done by the row's first block.
  if (chunk == 0 && tid < head) {
    const int64_t e = start + tid;
    out[e] = gelu_op<BWD>(x[e], BWD ? g[e] : 0.0f);
  }
  // BUG (planted): the forward has no scalar tail, so columns [tail_begin, cols) of a row
  // (up to 3 of them) are never written.
  if (BWD && chunk == chunks - 1 && tid < cols - tail_begin) {
    const int64_t e = start + tail_begin + tid;
    out[e] = gelu_op<BWD>(x[e], BWD ? g[e] : 0.0f);
  }
}

// Fallback for pointers that are not 16-byte aligned: one element per thread, grid-stride.
template <bool BWD>
__global__ void __launch_bounds__(kThreads)
gelu_scalar_kernel(const float* __restrict__ x, const float* __restrict__ g, float* __restrict__ out,
                   int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * kThreads;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; e < n; e += stride) {
    out[e] = gelu_op<BWD>(x[e], BWD ? g[e] : 0.0f);
  }
}

void check_f32_cuda(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32");
}

bool aligned16(const float* p) {
  return reinterpret_cast<std::uintptr_t>(p) % 16 == 0;
}

template <bool BWD>
void launch(const float* x, const float* g, float* out, int64_t n, int64_t cols, cudaStream_t stream) {
  if (n == 0) return;
  const bool vec = aligned16(x) && aligned16(out) && (!BWD || aligned16(g));
  if (vec && cols > 0) {
    const int64_t rows = n / cols;
    const int64_t max_vec = cols / 4;  // the body of any row has at most cols / 4 float4
    const int64_t chunks = max_vec > 0 ? (max_vec + kVecPerBlock - 1) / kVecPerBlock : 1;
    const int64_t blocks = rows * chunks;
    if (blocks <= INT32_MAX) {
      gelu_rows_kernel<BWD><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, g, out, cols, chunks);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
  }
  int64_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks > 65536) blocks = 65536;
  gelu_scalar_kernel<BWD><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(x, g, out, n);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

int64_t row_length(const torch::Tensor& x) {
  return x.dim() == 0 ? 1 : x.size(-1);
}

}  // namespace

torch::Tensor gelu_forward(torch::Tensor x) {
  check_f32_cuda(x, "x");
  const c10::cuda::CUDAGuard device_guard(x.device());
  auto y = torch::empty_like(x);
  launch<false>(x.data_ptr<float>(), nullptr, y.data_ptr<float>(), x.numel(), row_length(x),
                at::cuda::getCurrentCUDAStream());
  return y;
}

torch::Tensor gelu_backward(torch::Tensor x, torch::Tensor grad_y) {
  check_f32_cuda(x, "x");
  check_f32_cuda(grad_y, "grad_y");
  TORCH_CHECK(grad_y.sizes() == x.sizes(), "grad_y must have the shape of x");
  TORCH_CHECK(grad_y.device() == x.device(), "x and grad_y must be on the same device");
  const c10::cuda::CUDAGuard device_guard(x.device());
  auto dx = torch::empty_like(x);
  launch<true>(x.data_ptr<float>(), grad_y.data_ptr<float>(), dx.data_ptr<float>(), x.numel(),
               row_length(x), at::cuda::getCurrentCUDAStream());
  return dx;
}
"""

gelu_ext = load_inline(
    name="ctl_gelu_rows_no_tail",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gelu_forward", "gelu_backward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class GELUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        ctx.save_for_backward(x)
        return gelu_ext.gelu_forward(x)

    @staticmethod
    def backward(ctx, grad_y):
        (x,) = ctx.saved_tensors
        return gelu_ext.gelu_backward(x, grad_y.contiguous())


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return GELUFunction.apply(x)
