# expected: incorrect
# Defect: the forward is unrolled by 8 and its loop bound is off by one block
# ("i + 8 < n" instead of "i + 8 <= n"). The remainder loop only covers n % 8,
# so when n is a multiple of 8 (64*1024 here) the last 8 outputs are never
# written and stay 0. Backward is correct.
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
    // Zero-filled, so the skipped block reads as 0 (deterministic, just wrong).
    auto y = torch::zeros_like(x);
    const float* xp = x.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    const int64_t n = x.numel();
    int64_t i = 0;
    for (; i + 8 < n; i += 8) {  // BUG: should be "i + 8 <= n"
        for (int j = 0; j < 8; ++j) yp[i + j] = xp[i + j] < 0.0f ? 0.0f : xp[i + j];
    }
    // Remainder: assumes the main loop stopped at n - n % 8, which it did not.
    for (int64_t t = n - n % 8; t < n; ++t) yp[t] = xp[t] < 0.0f ? 0.0f : xp[t];
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
