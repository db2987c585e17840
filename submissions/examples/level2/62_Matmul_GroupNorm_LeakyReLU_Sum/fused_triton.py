# expected: pass
# Linear (cuBLAS via F.linear) -> one fused Triton kernel for GroupNorm + LeakyReLU + (x + x), the Triton twin of
# fused_cuda.py. Each program normalises GROUPS_PER_PROGRAM groups of one row in registers (a group here is 16
# channels). The backward recomputes the forward with PyTorch ops under autograd (only the forward is timed).
import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl

GROUPS_PER_PROGRAM = 32


@triton.jit
def gn_leaky_double_kernel(h_ptr, w_ptr, b_ptr, out_ptr, hidden, eps, slope, GROUP: tl.constexpr,
                           GROUPS_PER_PROGRAM: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    groups = tl.program_id(1) * GROUPS_PER_PROGRAM + tl.arange(0, GROUPS_PER_PROGRAM)
    columns = groups[:, None] * GROUP + tl.arange(0, GROUP)[None, :]
    x = tl.load(h_ptr + row * hidden + columns)
    mean = tl.sum(x, axis=1) / GROUP
    centred = x - mean[:, None]
    var = tl.sum(centred * centred, axis=1) / GROUP
    y = centred * tl.rsqrt(var + eps)[:, None] * tl.load(w_ptr + columns) + tl.load(b_ptr + columns)
    y = tl.where(y >= 0, y, y * slope)
    tl.store(out_ptr + row * hidden + columns, y + y)


class GroupNormLeakyDouble(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, bias, num_groups, eps, slope):
        batch, hidden = h.shape
        group = hidden // num_groups
        if hidden % num_groups or group & (group - 1) or num_groups % GROUPS_PER_PROGRAM:
            raise ValueError("this kernel wants power-of-two groups and a multiple of GROUPS_PER_PROGRAM groups")
        h = h.contiguous()
        out = torch.empty_like(h)
        grid = (batch, num_groups // GROUPS_PER_PROGRAM)
        gn_leaky_double_kernel[grid](h, weight.contiguous(), bias.contiguous(), out, hidden, eps, slope,
                                     GROUP=group, GROUPS_PER_PROGRAM=GROUPS_PER_PROGRAM, num_warps=4)
        ctx.save_for_backward(h, weight, bias)
        ctx.settings = (num_groups, eps, slope)
        return out

    @staticmethod
    def backward(ctx, grad):
        h, weight, bias = ctx.saved_tensors
        num_groups, eps, slope = ctx.settings
        with torch.enable_grad():
            leaves = [t.detach().requires_grad_() for t in (h, weight, bias)]
            y = F.leaky_relu(F.group_norm(leaves[0], num_groups, leaves[1], leaves[2], eps), slope)
            grads = torch.autograd.grad(y + y, leaves, grad)
        return (*grads, None, None, None)


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size, num_groups, eps=1e-5, negative_slope=0.01):
        super().__init__()
        self.fc = nn.Linear(input_size, hidden_size)
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=hidden_size, eps=eps)
        self.negative_slope = negative_slope

    def forward(self, x):
        h = F.linear(x, self.fc.weight, self.fc.bias)
        return GroupNormLeakyDouble.apply(h, self.gn.weight, self.gn.bias, self.gn.num_groups, self.gn.eps,
                                          self.negative_slope)
