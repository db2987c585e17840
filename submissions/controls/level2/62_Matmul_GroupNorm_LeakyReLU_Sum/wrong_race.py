# expected: incorrect|nondeterministic
# Planted defect: a race between lanes in the forward kernel. Each (row, group) now gets a full warp: its
# two half-warps both load the group's 16 channels (every value counted twice leaves the Welford mean and
# biased variance unchanged), and each half-warp adds its copy of a = leaky_relu(y) into the zero-filled
# output, so that out = a + a stands for x + x. The add is a plain read-modify-write (out[i] += a), not
# atomicAdd: lanes j and j + 16 of the same warp update the same address.
# Why it shows up every time: the two racing lanes belong to one warp and run the same straight-line code,
# so the load of out[i] is ONE warp instruction that serves both lanes, and so is the store. Both lanes read
# the 0 before either writes; one add is always lost and out = a instead of 2a for every element, i.e. half
# the reference (max abs error ~ the largest |a|, several units, against atol = rtol = 1e-4). The verdict
# is therefore `incorrect` on trial 0, before the repeat check. A GPU/compiler that ever split the warp
# between the load and the store could let some adds land, which would make the output vary from run to run
# (nondeterministic), but every element that still lost an add is off by |a|, so it would still read
# incorrect. (tests/conftest.py reads the word before '|', `incorrect`.) Everything else, the backward
# included, is the example fused_cuda.py.
# Linear (cuBLAS via F.linear) -> one fused CUDA kernel for GroupNorm + LeakyReLU + (x + x),
# with a custom autograd.Function whose backward is also written in CUDA.
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>
#include <vector>

// Returns {out, mean, rstd}; mean/rstd have shape (N, num_groups) and are kept for backward.
std::vector<torch::Tensor> gn_lrelu_double_forward(
    torch::Tensor h, torch::Tensor gamma, torch::Tensor beta,
    int64_t num_groups, double eps, double negative_slope);

// Returns {grad_h, grad_gamma, grad_beta}.
std::vector<torch::Tensor> gn_lrelu_double_backward(
    torch::Tensor grad_out, torch::Tensor h, torch::Tensor gamma, torch::Tensor beta,
    torch::Tensor mean, torch::Tensor rstd, int64_t num_groups, double negative_slope);
"""

cuda_source = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <vector>

namespace {

constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kMaxPerLane = 8;      // each lane keeps up to 8 channels in registers
constexpr int kMaxGroupSize = 32 * kMaxPerLane;
constexpr int kThreads = 256;

// Welford state with the same arithmetic as PyTorch's WelfordOps (SharedReduceOps.h), so that
// mean/rstd (and therefore the sign of the normalized value that picks the LeakyReLU branch)
// match nn.GroupNorm bit for bit. A value sitting at ~0 with a different rounding than the
// reference would take the other LeakyReLU slope in backward and blow the gradient tolerance.
// Explicit _rn intrinsics pin the rounding (nvcc would fuse a*b+c into the same fmas).
struct Welford {
  float mean;
  float m2;
  float nf;  // element count as float; 0 means "empty"
};

__device__ __forceinline__ Welford welford_add(Welford a, float x) {
  const float nf = a.nf + 1.0f;
  const float delta = __fsub_rn(x, a.mean);
  const float mean = __fadd_rn(a.mean, __fdiv_rn(delta, nf));
  const float delta2 = __fsub_rn(x, mean);
  return {mean, __fmaf_rn(delta, delta2, a.m2), nf};
}

__device__ __forceinline__ Welford welford_combine(Welford a, Welford b) {
  if (a.nf == 0.0f) return b;
  if (b.nf == 0.0f) return a;
  const float delta = __fsub_rn(b.mean, a.mean);
  const float n = __fadd_rn(a.nf, b.nf);
  const float nb_over_n = __fdiv_rn(b.nf, n);
  const float mean = __fmaf_rn(delta, nb_over_n, a.mean);
  const float m2 = __fmaf_rn(__fmul_rn(__fmul_rn(delta, delta), a.nf), nb_over_n,
                             __fadd_rn(a.m2, b.m2));
  return {mean, m2, n};
}

// Post-affine GroupNorm value, written exactly like PyTorch's GroupNorm1dForward:
// (x - mean) * rstd * gamma + beta. Shared by forward and both backward kernels so the
// LeakyReLU branch taken in backward is the one taken in forward.
__device__ __forceinline__ float normalize(float x, float mean, float rstd) {
  return __fmul_rn(__fsub_rn(x, mean), rstd);
}
__device__ __forceinline__ float affine(float xhat, float gamma, float beta) {
  return __fmaf_rn(xhat, gamma, beta);
}

// d(out)/d(y) * grad_out for out = 2 * leaky_relu(y): x + x gives 2*g, LeakyReLU's
// derivative is 1 for y > 0 and the slope otherwise (PyTorch: self > 0 ? g : g * slope).
__device__ __forceinline__ float grad_pre_activation(float grad_out, float y, float slope) {
  const float g2 = __fadd_rn(grad_out, grad_out);
  return y > 0.0f ? g2 : __fmul_rn(g2, slope);
}

// Layout shared by the two per-(row, group) kernels: `lanes` consecutive threads (a power of
// two <= 32, so sub-warps never straddle a warp) own one (row, group). Lane j holds channels
// j, j + lanes, ... of the group, which is also how PyTorch's RowwiseMomentsCUDAKernel
// splits a group across its 32 threads. For 16 channels per group a warp serves two groups.

// Forward: one read of h, one write of out; mean/rstd per (row, group) saved for backward.
// Here `lanes` is twice the usual sub-warp: its two halves each hold a full copy of the group, and each
// half contributes one term of x + x to the zero-filled output.
__global__ void gn_lrelu_double_fwd_kernel(
    const float* __restrict__ h, const float* __restrict__ gamma,
    const float* __restrict__ beta, float* __restrict__ out,
    float* __restrict__ mean_out, float* __restrict__ rstd_out,
    int64_t num_rows_groups, int group_size, int num_groups, int lanes,
    float eps, float slope) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t ng = tid / lanes;          // flat (row, group) index
  const int sub = static_cast<int>(tid % lanes);
  const int half = lanes >> 1;
  const int part = sub % half;              // lane within this half's copy of the group
  const bool valid = ng < num_rows_groups;  // tail lanes still join the shuffles
  const int64_t base = ng * group_size;     // groups are contiguous in a row-major (N, C)
  const int g = static_cast<int>(ng % num_groups);

  float v[kMaxPerLane];
  Welford st = {0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int i = part + k * half;
    v[k] = 0.0f;
    if (valid && i < group_size) {
      v[k] = h[base + i];
      st = welford_add(st, v[k]);
    }
  }

  // Same combine order as PyTorch's WarpReduce (shfl_down, halving offsets); the result is
  // read from the sub-warp's lane 0 and broadcast.
  for (int offset = lanes >> 1; offset > 0; offset >>= 1) {
    Welford other;
    other.mean = __shfl_down_sync(kFullMask, st.mean, offset, lanes);
    other.m2 = __shfl_down_sync(kFullMask, st.m2, offset, lanes);
    other.nf = __shfl_down_sync(kFullMask, st.nf, offset, lanes);
    st = welford_combine(st, other);
  }
  const float mean = __shfl_sync(kFullMask, st.mean, 0, lanes);
  const float m2 = __shfl_sync(kFullMask, st.m2, 0, lanes);
  const float nf = __shfl_sync(kFullMask, st.nf, 0, lanes);
  const float var = __fdiv_rn(m2, nf);                // biased variance
  const float rstd = rsqrtf(__fadd_rn(var, eps));    // PyTorch uses rsqrtf as well

  if (!valid) return;
  if (sub == 0) {
    mean_out[ng] = mean;
    rstd_out[ng] = rstd;
  }
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int i = part + k * half;
    if (i < group_size) {
      const int c = g * group_size + i;
      const float y = affine(normalize(v[k], mean, rstd), gamma[c], beta[c]);
      const float a = y > 0.0f ? y : __fmul_rn(y, slope);
      out[base + i] += a;   // x + x: one term from each half
    }
  }
}

// Backward. The check compares against PyTorch's own fp32 backward at atol = rtol = 1e-4, and
// for this problem that reference is itself ~3x the tolerance away from the float64 result on
// grad fc.weight (= grad_h^T @ x sums 1024 rows). So a "more accurate" formula fails; the
// kernels below reproduce the arithmetic of PyTorch's GroupNorm1dBackward
// (aten/src/ATen/native/cuda/group_norm_kernel.cu), with plain expressions so that nvcc
// contracts them into the same fmas it did there. g is dL/dy (after x + x and LeakyReLU).

// Per (row, group): c2, c3 from sum(g * gamma * h) and sum(g * gamma), then
// grad_h = rstd * gamma * g + c2 * h + c3  (algebraically rstd * (dxhat - mean(dxhat)
// - xhat * mean(dxhat * xhat)) with dxhat = g * gamma).
__global__ void gn_lrelu_double_bwd_input_kernel(
    const float* __restrict__ grad_out, const float* __restrict__ h,
    const float* __restrict__ gamma, const float* __restrict__ beta,
    const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
    float* __restrict__ grad_h, int64_t num_rows_groups, int group_size, int num_groups,
    int lanes, float slope) {
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t ng = tid / lanes;
  const int sub = static_cast<int>(tid % lanes);
  const bool valid = ng < num_rows_groups;
  const int64_t base = ng * group_size;
  const int g = static_cast<int>(ng % num_groups);
  const float mean = valid ? mean_in[ng] : 0.0f;
  const float rstd = valid ? rstd_in[ng] : 0.0f;

  float x[kMaxPerLane];
  float dy[kMaxPerLane];
  float sum1 = 0.0f;  // sum g * h * gamma
  float sum2 = 0.0f;  // sum g * gamma
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int i = sub + k * lanes;
    x[k] = 0.0f;
    dy[k] = 0.0f;
    if (valid && i < group_size) {
      const int c = g * group_size + i;
      const float gm = gamma[c];
      x[k] = h[base + i];
      dy[k] = grad_pre_activation(grad_out[base + i],
                                  affine(normalize(x[k], mean, rstd), gm, beta[c]), slope);
      sum1 += dy[k] * x[k] * gm;
      sum2 += dy[k] * gm;
    }
  }
  // Same order as PyTorch's WarpReduceSum (shfl_down); lane 0 of the sub-warp has the totals.
  for (int offset = lanes >> 1; offset > 0; offset >>= 1) {
    sum1 += __shfl_down_sync(kFullMask, sum1, offset, lanes);
    sum2 += __shfl_down_sync(kFullMask, sum2, offset, lanes);
  }
  float c2 = 0.0f;
  float c3 = 0.0f;
  if (sub == 0) {
    const float s = 1.0f / static_cast<float>(group_size);
    c2 = (sum2 * mean - sum1) * rstd * rstd * rstd * s;
    c3 = -c2 * mean - (sum2 * rstd) * s;
  }
  c2 = __shfl_sync(kFullMask, c2, 0, lanes);
  c3 = __shfl_sync(kFullMask, c3, 0, lanes);
  if (!valid) return;
#pragma unroll
  for (int k = 0; k < kMaxPerLane; ++k) {
    const int i = sub + k * lanes;
    if (i < group_size) {
      const int c = g * group_size + i;
      const float c1 = rstd * gamma[c];
      grad_h[base + i] = c1 * dy[k] + c2 * x[k] + c3;
    }
  }
}

// dgamma[c] = sum_n g * (h - mean) * rstd, dbeta[c] = sum_n g: a deterministic column
// reduction (no atomics) laid out like PyTorch's GammaBeta1dBackwardCUDAKernel2. A (32, 16)
// block owns 32 columns; thread (tx, ty) sums rows ty, ty + 32, ... and ty + 16, ty + 48, ...
// separately, the 32 partials per column go through shared memory and a 32-lane shuffle sum.
constexpr int kColTile = 32;
constexpr int kRowThreads = kColTile / 2;

__global__ void gn_lrelu_double_bwd_params_kernel(
    const float* __restrict__ grad_out, const float* __restrict__ h,
    const float* __restrict__ gamma, const float* __restrict__ beta,
    const float* __restrict__ mean_in, const float* __restrict__ rstd_in,
    float* __restrict__ grad_gamma, float* __restrict__ grad_beta,
    int64_t num_rows, int channels, int group_size, int num_groups, float slope) {
  __shared__ float s_dg[kColTile][kColTile + 1];
  __shared__ float s_db[kColTile][kColTile + 1];
  const int c = blockIdx.x * kColTile + threadIdx.x;
  float dg_sum1 = 0.0f, dg_sum2 = 0.0f, db_sum1 = 0.0f, db_sum2 = 0.0f;
  if (c < channels) {
    const int g = c / group_size;
    const float gm = gamma[c];
    const float bt = beta[c];
    for (int64_t n = threadIdx.y; n < num_rows; n += 2 * kRowThreads) {
      const int64_t n1 = n;
      const int64_t n2 = n + kRowThreads;
      {
        const int64_t ng = n1 * num_groups + g;
        const float x = h[n1 * channels + c];
        const float m = mean_in[ng];
        const float r = rstd_in[ng];
        const float dy = grad_pre_activation(grad_out[n1 * channels + c],
                                             affine(normalize(x, m, r), gm, bt), slope);
        dg_sum1 += (dy * x - dy * m) * r;
        db_sum1 += dy;
      }
      if (n2 < num_rows) {
        const int64_t ng = n2 * num_groups + g;
        const float x = h[n2 * channels + c];
        const float m = mean_in[ng];
        const float r = rstd_in[ng];
        const float dy = grad_pre_activation(grad_out[n2 * channels + c],
                                             affine(normalize(x, m, r), gm, bt), slope);
        dg_sum2 += (dy * x - dy * m) * r;
        db_sum2 += dy;
      }
    }
  }
  s_dg[threadIdx.y][threadIdx.x] = dg_sum1;
  s_dg[threadIdx.y + kRowThreads][threadIdx.x] = dg_sum2;
  s_db[threadIdx.y][threadIdx.x] = db_sum1;
  s_db[threadIdx.y + kRowThreads][threadIdx.x] = db_sum2;
  __syncthreads();
  // Warp ty (its 32 lanes = the 32 row partials) finishes column ty, then column ty + 16.
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int col = threadIdx.y + half * kRowThreads;
    float dg = s_dg[threadIdx.x][col];
    float db = s_db[threadIdx.x][col];
    for (int offset = 16; offset > 0; offset >>= 1) {
      dg += __shfl_down_sync(kFullMask, dg, offset);
      db += __shfl_down_sync(kFullMask, db, offset);
    }
    const int out_c = blockIdx.x * kColTile + col;
    if (threadIdx.x == 0 && out_c < channels) {
      grad_gamma[out_c] = dg;
      grad_beta[out_c] = db;
    }
  }
}

void check_f32_cuda(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cuda(), name, " must be a CUDA tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32");
}

// Smallest power of two >= group_size, capped at a warp.
int lanes_per_group(int group_size) {
  int lanes = 1;
  while (lanes < group_size && lanes < 32) lanes <<= 1;
  return lanes;
}

void check_shapes(const torch::Tensor& h, const torch::Tensor& gamma,
                  const torch::Tensor& beta, int64_t num_groups) {
  TORCH_CHECK(h.dim() == 2, "expected a 2-D (batch, channels) input");
  const int64_t C = h.size(1);
  TORCH_CHECK(num_groups > 0 && C % num_groups == 0, "channels must divide into groups");
  TORCH_CHECK(C / num_groups <= kMaxGroupSize, "at most ", kMaxGroupSize,
              " channels per group are supported");
  TORCH_CHECK(C <= INT32_MAX, "too many channels");
  TORCH_CHECK(gamma.numel() == C && beta.numel() == C, "gamma/beta must have C elements");
  TORCH_CHECK(gamma.device() == h.device() && beta.device() == h.device(),
              "all tensors must be on the same device");
}

}  // namespace

std::vector<torch::Tensor> gn_lrelu_double_forward(
    torch::Tensor h, torch::Tensor gamma, torch::Tensor beta,
    int64_t num_groups, double eps, double negative_slope) {
  check_f32_cuda(h, "h");
  check_f32_cuda(gamma, "gamma");
  check_f32_cuda(beta, "beta");
  check_shapes(h, gamma, beta, num_groups);
  const c10::cuda::CUDAGuard device_guard(h.device());

  const int64_t N = h.size(0);
  const int C = static_cast<int>(h.size(1));
  const int D = static_cast<int>(C / num_groups);
  auto out = torch::zeros_like(h);   // the two halves accumulate into it
  auto mean = torch::empty({N, num_groups}, h.options());
  auto rstd = torch::empty({N, num_groups}, h.options());
  const int64_t rows_groups = N * num_groups;
  if (rows_groups == 0) return {out, mean, rstd};

  const int lanes = 2 * lanes_per_group(D);   // two copies of the group per sub-warp
  TORCH_CHECK(lanes <= 32, "at most 16 channels per group are supported by this forward");
  const int64_t blocks = (rows_groups * lanes + kThreads - 1) / kThreads;
  TORCH_CHECK(blocks <= INT32_MAX, "input too large for a 1-D grid");
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  gn_lrelu_double_fwd_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      h.data_ptr<float>(), gamma.data_ptr<float>(), beta.data_ptr<float>(),
      out.data_ptr<float>(), mean.data_ptr<float>(), rstd.data_ptr<float>(),
      rows_groups, D, static_cast<int>(num_groups), lanes,
      static_cast<float>(eps), static_cast<float>(negative_slope));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {out, mean, rstd};
}

std::vector<torch::Tensor> gn_lrelu_double_backward(
    torch::Tensor grad_out, torch::Tensor h, torch::Tensor gamma, torch::Tensor beta,
    torch::Tensor mean, torch::Tensor rstd, int64_t num_groups, double negative_slope) {
  check_f32_cuda(grad_out, "grad_out");
  check_f32_cuda(h, "h");
  check_f32_cuda(gamma, "gamma");
  check_f32_cuda(beta, "beta");
  check_f32_cuda(mean, "mean");
  check_f32_cuda(rstd, "rstd");
  check_shapes(h, gamma, beta, num_groups);
  TORCH_CHECK(grad_out.sizes() == h.sizes(), "grad_out must have the shape of the output");
  TORCH_CHECK(mean.numel() == h.size(0) * num_groups && rstd.numel() == mean.numel(),
              "mean/rstd must have N * num_groups elements");
  const c10::cuda::CUDAGuard device_guard(h.device());

  const int64_t N = h.size(0);
  const int C = static_cast<int>(h.size(1));
  const int D = static_cast<int>(C / num_groups);
  auto grad_h = torch::empty_like(h);
  auto grad_gamma = torch::zeros_like(gamma);
  auto grad_beta = torch::zeros_like(beta);
  const int64_t rows_groups = N * num_groups;
  if (rows_groups == 0) return {grad_h, grad_gamma, grad_beta};

  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const float slope = static_cast<float>(negative_slope);

  const int lanes = lanes_per_group(D);
  const int64_t blocks = (rows_groups * lanes + kThreads - 1) / kThreads;
  TORCH_CHECK(blocks <= INT32_MAX, "input too large for a 1-D grid");
  gn_lrelu_double_bwd_input_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      grad_out.data_ptr<float>(), h.data_ptr<float>(), gamma.data_ptr<float>(),
      beta.data_ptr<float>(), mean.data_ptr<float>(), rstd.data_ptr<float>(),
      grad_h.data_ptr<float>(), rows_groups, D, static_cast<int>(num_groups), lanes, slope);
  C10_CUDA_KERNEL_LAUNCH_CHECK();

  const dim3 param_block(kColTile, kRowThreads);
  const unsigned param_blocks = static_cast<unsigned>((C + kColTile - 1) / kColTile);
  gn_lrelu_double_bwd_params_kernel<<<param_blocks, param_block, 0, stream>>>(
      grad_out.data_ptr<float>(), h.data_ptr<float>(), gamma.data_ptr<float>(),
      beta.data_ptr<float>(), mean.data_ptr<float>(), rstd.data_ptr<float>(),
      grad_gamma.data_ptr<float>(), grad_beta.data_ptr<float>(), N, C, D,
      static_cast<int>(num_groups), slope);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {grad_h, grad_gamma, grad_beta};
}
"""

fused_ops = load_inline(
    name="fused_ops",
    cpp_sources=cpp_source,
    cuda_sources=cuda_source,
    functions=["gn_lrelu_double_forward", "gn_lrelu_double_backward"],
    extra_cuda_cflags=["-O3"],
    verbose=False,
)


class GroupNormLeakyReLUDouble(torch.autograd.Function):
    """out = 2 * leaky_relu(group_norm(h)); forward and backward are the CUDA kernels above."""

    @staticmethod
    def forward(ctx, h, gamma, beta, num_groups, eps, negative_slope):
        h = h.contiguous()
        gamma = gamma.contiguous()
        beta = beta.contiguous()
        out, mean, rstd = fused_ops.gn_lrelu_double_forward(
            h, gamma, beta, num_groups, eps, negative_slope)
        ctx.save_for_backward(h, gamma, beta, mean, rstd)
        ctx.num_groups = num_groups
        ctx.negative_slope = negative_slope
        return out

    @staticmethod
    def backward(ctx, grad_out):
        h, gamma, beta, mean, rstd = ctx.saved_tensors
        grad_h, grad_gamma, grad_beta = fused_ops.gn_lrelu_double_backward(
            grad_out.contiguous(), h, gamma, beta, mean, rstd,
            ctx.num_groups, ctx.negative_slope)
        return grad_h, grad_gamma, grad_beta, None, None, None


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, num_groups, eps=1e-5, negative_slope=0.01):
        super().__init__()
        # Same submodule names as the reference so its state_dict loads into ours.
        self.fc = nn.Linear(input_size, hidden_size)
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=hidden_size, eps=eps)
        self.negative_slope = negative_slope

    def forward(self, x):
        # F.linear is the very call nn.Linear makes, so the matmul (and its autograd
        # backward) matches the reference bit for bit on the same GPU.
        h = F.linear(x, self.fc.weight, self.fc.bias)
        return GroupNormLeakyReLUDouble.apply(
            h, self.gn.weight, self.gn.bias, self.gn.num_groups, self.gn.eps,
            self.negative_slope)
