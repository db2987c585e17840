# expected: grad_mismatch
# Planted defect: the ReLU backward tests the saved output with y >= 0 instead of y > 0. After a ReLU every
# y is >= 0, so the mask is always true and the gradient leaks through every negative pre-activation (about
# half of the 2 x 8M hidden elements): grad_h = g instead of g * (h > 0). grad_x, grad_W and grad_b of both
# hidden layers are wrong by O(1) relative. The forward is untouched and exact, so outputs pass and the
# status is grad_mismatch (the output has a graph and its gradients are wrong: `grad_mismatch_fails`, on in
# every config that checks gradients). Everything else is correct_cuda.py.
# Control for level3/1 (Linear -> ReLU -> Linear -> ReLU -> Linear). Matmuls stay in cuBLAS; each hidden
# layer is one autograd.Function whose activation and backward epilogue are CUDA:
#   forward:  h = F.linear(x, W, b) (the very addmm that nn.Linear issues, so h is bit-identical to the
#             reference's), then a CUDA ReLU applied in place on h.
#   backward: ONE CUDA kernel masks the gradient (grad_h = g where y > 0, as PyTorch's threshold_backward)
#             and writes per-row-chunk column sums of grad_h; a second kernel adds those partials in a fixed
#             order into grad_b (deterministic, no atomics). grad_x = grad_h W and grad_W = grad_h^T x are
#             the same mm calls autograd's addmm backward makes.
# Why the bias add is not fused into the ReLU kernel: the ReLU mask of the backward depends on the sign of
# the pre-activation, and an element within an ulp of 0 whose sign differs from the reference's flips one
# row of grad_W by O(0.1), far beyond the 1e-3 gradient tolerance. (mm without bias) + (bias added here)
# is only bit-identical to the reference's cuBLASLt fused-bias addmm if both calls pick the same GEMM
# kernel, which nothing guarantees; with rounding differences of 1e-7..1e-6, 8M pre-activations per layer
# would be expected to give about one to a few sign flips per layer. Computing h with the reference's own addmm makes the mask, and with it every
# gradient but grad_b, bit-identical.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

// y = relu(h), in place; returns h.
torch::Tensor relu_forward_(torch::Tensor h);

// From the layer output y = relu(h): returns {grad_h = g * (y > 0), grad_bias = column sums of grad_h}.
std::vector<torch::Tensor> relu_bias_backward(torch::Tensor grad_out, torch::Tensor y);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <vector>

namespace {

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

template <int VEC>
__global__ void relu_inplace_kernel(float* __restrict__ h, int64_t num_vec) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < num_vec;
       i += stride) {
    Vec<VEC> x = load_vec<VEC>(h + i * VEC);
#pragma unroll
    for (int k = 0; k < VEC; ++k) x.v[k] = x.v[k] > 0.0f ? x.v[k] : 0.0f;
    store_vec<VEC>(h + i * VEC, x);
  }
}

// Backward, pass 1: grad_h = g where y > 0 (y = relu(h) > 0 exactly where h > 0; PyTorch's ReLU backward
// is threshold_backward(g, y, 0), the same test) for a (kRowsPerChunk x kBwdX * VEC) tile, plus the
// tile's column sums of grad_h in partial[chunk][col]. Each thread sums its rows in increasing order, the
// 8 row-threads of a column are added in a fixed order through shared memory.
template <int VEC>
__global__ void relu_bias_bwd_kernel(
    const float* __restrict__ grad_out, const float* __restrict__ y, float* __restrict__ grad_h,
    float* __restrict__ partial, int64_t rows, int cols) {
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
    for (int64_t r = row_begin + threadIdx.y; r < row_end; r += kBwdY) {
      const int64_t off = r * cols + static_cast<int64_t>(cv) * VEC;
      const Vec<VEC> gv = load_vec<VEC>(grad_out + off);
      const Vec<VEC> yv = load_vec<VEC>(y + off);
      Vec<VEC> d;
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        d.v[k] = yv.v[k] >= 0.0f ? gv.v[k] : 0.0f;
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
      for (int yy = 0; yy < kBwdY; ++yy) s += s_acc[yy][c];
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

bool aligned16(const torch::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

}  // namespace

torch::Tensor relu_forward_(torch::Tensor h) {
  check_f32_cuda(h, "h");
  const c10::cuda::CUDAGuard device_guard(h.device());
  const int64_t numel = h.numel();
  if (numel == 0) return h;
  const bool vec4 = numel % 4 == 0 && aligned16(h);
  const int64_t num_vec = vec4 ? numel / 4 : numel;
  const int64_t blocks = std::min<int64_t>((num_vec + kThreads - 1) / kThreads, 1 << 20);
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (vec4) {
    relu_inplace_kernel<4><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        h.data_ptr<float>(), num_vec);
  } else {
    relu_inplace_kernel<1><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
        h.data_ptr<float>(), num_vec);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return h;
}

std::vector<torch::Tensor> relu_bias_backward(torch::Tensor grad_out, torch::Tensor y) {
  check_f32_cuda(grad_out, "grad_out");
  check_f32_cuda(y, "y");
  TORCH_CHECK(y.dim() == 2, "expected a 2-D (rows, cols) activation");
  TORCH_CHECK(grad_out.sizes() == y.sizes(), "grad_out must have the shape of the output");
  TORCH_CHECK(grad_out.device() == y.device(), "tensors must be on the same device");
  TORCH_CHECK(y.size(1) <= INT32_MAX / 2, "too many columns");
  const c10::cuda::CUDAGuard device_guard(y.device());
  const int64_t rows = y.size(0);
  const int cols = static_cast<int>(y.size(1));
  auto grad_h = torch::empty_like(y);
  auto grad_bias = torch::zeros({cols}, y.options());
  if (rows == 0 || cols == 0) return {grad_h, grad_bias};

  const int64_t num_chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk;
  TORCH_CHECK(num_chunks <= 65535, "too many rows for the backward grid");
  auto partial = torch::empty({num_chunks, static_cast<int64_t>(cols)}, y.options());
  const bool vec4 = cols % 4 == 0 && aligned16(grad_out) && aligned16(y) && aligned16(grad_h);
  const int vec = vec4 ? 4 : 1;
  const int cols_vec = cols / vec;
  const dim3 block(kBwdX, kBwdY);
  const dim3 grid(static_cast<unsigned>((cols_vec + kBwdX - 1) / kBwdX),
                  static_cast<unsigned>(num_chunks));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (vec4) {
    relu_bias_bwd_kernel<4><<<grid, block, 0, stream>>>(
        grad_out.data_ptr<float>(), y.data_ptr<float>(), grad_h.data_ptr<float>(),
        partial.data_ptr<float>(), rows, cols);
  } else {
    relu_bias_bwd_kernel<1><<<grid, block, 0, stream>>>(
        grad_out.data_ptr<float>(), y.data_ptr<float>(), grad_h.data_ptr<float>(),
        partial.data_ptr<float>(), rows, cols);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  column_sum_kernel<<<static_cast<unsigned>((cols + kThreads - 1) / kThreads), kThreads, 0, stream>>>(
      partial.data_ptr<float>(), grad_bias.data_ptr<float>(), static_cast<int>(num_chunks), cols);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {grad_h, grad_bias};
}
"""

relu_ops = load_inline(
    name="mlp_relu_ops",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["relu_forward_", "relu_bias_backward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class LinearReLU(torch.autograd.Function):
    """relu(x W^T + b) for 2-D x; the ReLU and the whole backward epilogue are the CUDA kernels above."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        h = F.linear(x, weight, bias)        # addmm(b, x, W^T): the reference's own call
        y = relu_ops.relu_forward_(h)        # in place: h is a temporary of this function
        ctx.save_for_backward(x, weight, y)
        return y

    @staticmethod
    def backward(ctx, grad_out):
        x, weight, y = ctx.saved_tensors
        grad_h, grad_bias = relu_ops.relu_bias_backward(grad_out.contiguous(), y)
        grad_x = grad_h.mm(weight) if ctx.needs_input_grad[0] else None
        grad_w = grad_h.t().mm(x) if ctx.needs_input_grad[1] else None
        return grad_x, grad_w, grad_bias


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_sizes, output_size):
        super().__init__()
        # The reference's exact layout, so network.{0,2,4}.{weight,bias} load by name and shape.
        layers = []
        current = input_size
        for size in hidden_sizes:
            layers += [nn.Linear(current, size), nn.ReLU()]
            current = size
        layers.append(nn.Linear(current, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        layers = list(self.network)
        i = 0
        while i < len(layers):
            layer = layers[i]
            if i + 1 < len(layers) and isinstance(layers[i + 1], nn.ReLU):
                x = LinearReLU.apply(x, layer.weight, layer.bias)
                i += 2
            else:
                x = F.linear(x, layer.weight, layer.bias)   # the output layer, as in the reference
                i += 1
        return x
