# expected: pass
# ReLU with hand-written C++ forward and backward kernels, wired through autograd.
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp_source = r"""
#include <torch/extension.h>

static void check_input(const torch::Tensor& t, const char* name) {
    TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
    TORCH_CHECK(t.scalar_type() == torch::kFloat32, name, " must be float32");
    TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

torch::Tensor relu_forward(torch::Tensor x) {
    check_input(x, "x");
    auto y = torch::empty_like(x);
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t n = x.numel();
    // "x < 0 ? 0 : x" (not "x > 0 ? x : 0") so that NaN propagates like torch.relu.
    for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] < 0.0f ? 0.0f : xp[i];
    return y;
}

// dReLU/dx is 1 where x > 0, else 0 (torch also uses 0 at x == 0).
torch::Tensor relu_backward(torch::Tensor grad_out, torch::Tensor x) {
    check_input(grad_out, "grad_out");
    check_input(x, "x");
    TORCH_CHECK(grad_out.numel() == x.numel(), "grad_out and x sizes differ");
    auto dx = torch::empty_like(x);
    const float* gp = grad_out.data_ptr<float>();
    const float* xp = x.data_ptr<float>();
    float* dp = dx.data_ptr<float>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) dp[i] = xp[i] > 0.0f ? gp[i] : 0.0f;
    return dx;
}
"""

ext = load_inline(
    name="ext",
    cpp_sources=cpp_source,
    functions=["relu_forward", "relu_backward"],
    extra_cflags=["-O2"],
    verbose=False,
)


class ReLUFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        ctx.save_for_backward(x)
        return ext.relu_forward(x)

    @staticmethod
    def backward(ctx, grad_out):
        (x,) = ctx.saved_tensors
        return ext.relu_backward(grad_out.contiguous(), x)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return ReLUFunction.apply(x)
