# expected: pass
# Control for level2/1: the GEMM stays in PyTorch (F.linear without bias, the very call the reference's
# nn.Linear(bias=False) makes, so h = x W^T is bit-identical), then ONE fused CUDA kernel does bias add +
# exact (erf) GELU + scale in a single pass over the (4096, 8192) output instead of three. The backward of
# the epilogue is CUDA too: grad_h = g * s * (Phi(z) + z * phi(z)) with z = h + b recomputed from the saved
# h (nothing extra is written in forward), and grad_bias = column sums of grad_h, reduced deterministically
# (fixed per-block partials, then a fixed-order sum over the blocks; no atomics). The matmul's gradients
# come from autograd's own mm backward, exactly as in the reference.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

// out = gelu(h + bias) * scale, h of shape (rows, cols), bias of shape (cols).
torch::Tensor bias_gelu_scale_forward(torch::Tensor h, torch::Tensor bias, double scale);

// Returns {grad_h, grad_bias}.
std::vector<torch::Tensor> bias_gelu_scale_backward(
    torch::Tensor grad_out, torch::Tensor h, torch::Tensor bias, double scale);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <vector>

namespace {

// The constants of PyTorch's exact GELU (GeluCUDAKernelImpl / GeluBackwardCUDAKernelImpl):
// kAlpha = M_SQRT1_2, kBeta = M_2_SQRTPI * M_SQRT1_2 * 0.5 = 1 / sqrt(2 pi), both rounded to float.
constexpr float kAlpha = static_cast<float>(0.70710678118654752440);
constexpr float kBeta = static_cast<float>(1.12837916709551257390 * 0.70710678118654752440 * 0.5);

constexpr int kThreads = 256;
// Backward tiling: a block is (32, 8) threads; thread (tx, ty) owns VEC consecutive columns and the rows
// ty, ty + 8, ... of one chunk of kRowsPerChunk rows.
constexpr int kBwdX = 32;
constexpr int kBwdY = 8;
constexpr int kRowsPerChunk = 64;

template <int VEC>
struct alignas(4 * VEC) Vec {
  float v[VEC];
};

template <int VEC>
__device__ __forceinline__ Vec<VEC> load_vec(const float* p) {
  return *reinterpret_cast<const Vec<VEC>*>(p);
}

template <int VEC>
__device__ __forceinline__ void store_vec(float* p, const Vec<VEC>& x) {
  *reinterpret_cast<Vec<VEC>*>(p) = x;
}

// gelu(z) written like PyTorch: 0.5 * z * (1 + erf(z / sqrt(2))).
__device__ __forceinline__ float gelu_exact(float z) {
  return 0.5f * z * (1.0f + erff(z * kAlpha));
}

// d gelu(z) / dz = Phi(z) + z * phi(z), times dy; the same expression as PyTorch's GELU backward.
__device__ __forceinline__ float gelu_exact_backward(float dy, float z) {
  const float cdf = 0.5f * (1.0f + erff(z * kAlpha));
  const float pdf = expf(-0.5f * z * z) * kBeta;
  return dy * (cdf + z * pdf);
}

// Forward: one read of h, one write of out. Element i of the flat (rows, cols) tensor belongs to
// column i % cols; VEC consecutive elements never straddle a row because cols % VEC == 0.
template <int VEC>
__global__ void bias_gelu_scale_fwd_kernel(
    const float* __restrict__ h, const float* __restrict__ bias, float* __restrict__ out,
    int64_t num_vec, int cols_vec, float scale) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < num_vec;
       i += stride) {
    const int cv = static_cast<int>(i % cols_vec);
    const Vec<VEC> hv = load_vec<VEC>(h + i * VEC);
    const Vec<VEC> bv = load_vec<VEC>(bias + static_cast<int64_t>(cv) * VEC);
    Vec<VEC> o;
#pragma unroll
    for (int k = 0; k < VEC; ++k) {
      const float z = hv.v[k] + bv.v[k];        // x + self.bias
      o.v[k] = gelu_exact(z) * scale;           // F.gelu(x) * self.scale
    }
    store_vec<VEC>(out + i * VEC, o);
  }
}

// Backward, pass 1: grad_h for a (kRowsPerChunk rows) x (kBwdX * VEC columns) tile, plus the tile's
// column sums of grad_h written to partial[chunk][col]. Each thread sums its rows in increasing order,
// then the 8 row-threads of a column are added in a fixed order through shared memory: the result does
// not depend on scheduling.
template <int VEC>
__global__ void bias_gelu_scale_bwd_kernel(
    const float* __restrict__ grad_out, const float* __restrict__ h,
    const float* __restrict__ bias, float* __restrict__ grad_h, float* __restrict__ partial,
    int64_t rows, int cols, float scale) {
  __shared__ float s_acc[kBwdY][kBwdX * VEC];
  const int cols_vec = cols / VEC;
  const int cv = blockIdx.x * kBwdX + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t row_begin = chunk * kRowsPerChunk;
  const int64_t row_end = min(rows, row_begin + kRowsPerChunk);

  float acc[VEC];
#pragma unroll
  for (int k = 0; k < VEC; ++k) acc[k] = 0.0f;

  if (cv < cols_vec) {
    const Vec<VEC> bv = load_vec<VEC>(bias + static_cast<int64_t>(cv) * VEC);
    for (int64_t r = row_begin + threadIdx.y; r < row_end; r += kBwdY) {
      const int64_t off = r * cols + static_cast<int64_t>(cv) * VEC;
      const Vec<VEC> gv = load_vec<VEC>(grad_out + off);
      const Vec<VEC> hv = load_vec<VEC>(h + off);
      Vec<VEC> d;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        const float z = hv.v[k] + bv.v[k];                          // same z as forward
        d.v[k] = gelu_exact_backward(gv.v[k] * scale, z);         // (g * s) * gelu'(z)
        acc[k] += d.v[k];
      }
      store_vec<VEC>(grad_h + off, d);
    }
  }
#pragma unroll
  for (int k = 0; k < VEC; ++k) s_acc[threadIdx.y][threadIdx.x * VEC + k] = acc[k];
  __syncthreads();

  const int tid = threadIdx.y * kBwdX + threadIdx.x;
  for (int c = tid; c < kBwdX * VEC; c += kBwdX * kBwdY) {
    const int col = blockIdx.x * kBwdX * VEC + c;
    if (col < cols) {
      float s = 0.0f;
#pragma unroll
      for (int y = 0; y < kBwdY; ++y) s += s_acc[y][c];
      partial[chunk * cols + col] = s;
    }
  }
}

// Backward, pass 2: grad_bias[col] = sum over chunks of partial[chunk][col], in chunk order.
__global__ void column_sum_kernel(const float* __restrict__ partial, float* __restrict__ out,
                                  int num_chunks, int cols) {
  const int col = blockIdx.x * blockDim.x + threadIdx.x;
  if (col >= cols) return;
  float s = 0.0f;
  for (int k = 0; k < num_chunks; ++k) s += partial[static_cast<int64_t>(k) * cols + col];
  out[col] = s;
}

void check_f32_cuda(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32");
}

void check_shapes(const torch::Tensor& h, const torch::Tensor& bias) {
  TORCH_CHECK(h.dim() == 2, "expected a 2-D (rows, cols) input");
  TORCH_CHECK(bias.dim() == 1 && bias.size(0) == h.size(1), "bias must have cols elements");
  TORCH_CHECK(h.size(1) <= INT32_MAX / 2, "too many columns");
  TORCH_CHECK(bias.device() == h.device(), "h and bias must be on the same device");
}

bool aligned16(const torch::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

}  // namespace

torch::Tensor bias_gelu_scale_forward(torch::Tensor h, torch::Tensor bias, double scale) {
  check_f32_cuda(h, "h");
  check_f32_cuda(bias, "bias");
  check_shapes(h, bias);
  const c10::cuda::CUDAGuard device_guard(h.device());
  auto out = torch::empty_like(h);
  const int64_t numel = h.numel();
  if (numel == 0) return out;
  const int cols = static_cast<int>(h.size(1));
  const bool vec4 = cols % 4 == 0 && aligned16(h) && aligned16(bias) && aligned16(out);
  const int vec = vec4 ? 4 : 1;
  const int64_t num_vec = numel / vec;
  const int64_t blocks = std::min<int64_t>((num_vec + kThreads - 1) / kThreads, 1 << 20);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (vec4) {
    bias_gelu_scale_fwd_kernel<4><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        h.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(), num_vec, cols / 4,
        static_cast<float>(scale));
  } else {
    bias_gelu_scale_fwd_kernel<1><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        h.data_ptr<float>(), bias.data_ptr<float>(), out.data_ptr<float>(), num_vec, cols,
        static_cast<float>(scale));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

std::vector<torch::Tensor> bias_gelu_scale_backward(
    torch::Tensor grad_out, torch::Tensor h, torch::Tensor bias, double scale) {
  check_f32_cuda(grad_out, "grad_out");
  check_f32_cuda(h, "h");
  check_f32_cuda(bias, "bias");
  check_shapes(h, bias);
  TORCH_CHECK(grad_out.sizes() == h.sizes(), "grad_out must have the shape of the output");
  const c10::cuda::CUDAGuard device_guard(h.device());
  const int64_t rows = h.size(0);
  const int cols = static_cast<int>(h.size(1));
  auto grad_h = torch::empty_like(h);
  auto grad_bias = torch::zeros_like(bias);
  if (rows == 0 || cols == 0) return {grad_h, grad_bias};

  const int64_t num_chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  TORCH_CHECK(num_chunks <= 65535, "too many rows for the backward grid");
  auto partial = torch::empty({num_chunks, static_cast<int64_t>(cols)}, h.options());
  const bool vec4 = cols % 4 == 0 && aligned16(grad_out) && aligned16(h) && aligned16(bias) &&
                    aligned16(grad_h);
  const int vec = vec4 ? 4 : 1;
  const int cols_vec = cols / vec;
  const dim3 block(kBwdX, kBwdY);
  const dim3 grid(static_cast<unsigned>((cols_vec + kBwdX - 1) / kBwdX),
                  static_cast<unsigned>(num_chunks));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (vec4) {
    bias_gelu_scale_bwd_kernel<4><<<grid, block, 0, stream>>>(
        grad_out.data_ptr<float>(), h.data_ptr<float>(), bias.data_ptr<float>(),
        grad_h.data_ptr<float>(), partial.data_ptr<float>(), rows, cols, static_cast<float>(scale));
  } else {
    bias_gelu_scale_bwd_kernel<1><<<grid, block, 0, stream>>>(
        grad_out.data_ptr<float>(), h.data_ptr<float>(), bias.data_ptr<float>(),
        grad_h.data_ptr<float>(), partial.data_ptr<float>(), rows, cols, static_cast<float>(scale));
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  column_sum_kernel<<<static_cast<unsigned>((cols + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      partial.data_ptr<float>(), grad_bias.data_ptr<float>(), static_cast<int>(num_chunks), cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {grad_h, grad_bias};
}
"""

bias_gelu_ops = load_inline(
    name="bias_gelu_scale_ops",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["bias_gelu_scale_forward", "bias_gelu_scale_backward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class BiasGeluScale(torch.autograd.Function):
    """out = gelu(h + bias) * scale; forward and backward are the CUDA kernels above."""

    @staticmethod
    def forward(ctx, h, bias, scale):
        h = h.contiguous()
        bias = bias.contiguous()
        out = bias_gelu_ops.bias_gelu_scale_forward(h, bias, float(scale))
        ctx.save_for_backward(h, bias)  # z = h + bias is recomputed in backward
        ctx.scale = float(scale)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, bias = ctx.saved_tensors
        grad_h, grad_bias = bias_gelu_ops.bias_gelu_scale_backward(
            grad_out.contiguous(), h, bias, ctx.scale)
        return grad_h, grad_bias, None


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super().__init__()
        # Same names and shapes as the reference (linear.weight, bias) so its state_dict loads.
        self.linear = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(out_features) * 0.1)
        self.scale = scale

    def forward(self, x):
        h = F.linear(x, self.linear.weight)  # cuBLAS, fp32; autograd supplies the matmul gradients
        return BiasGeluScale.apply(h, self.bias, self.scale)
