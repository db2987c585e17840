# expected: pass
# Row softmax as one Triton kernel (backend: triton): one program per row, the whole row (16384 floats) loaded once
# into registers, the row max subtracted before exp, y = exp(x - max) / sum. The backward is PyTorch's own
# (dx = y * (g - sum(g * y))) through an autograd Function; only the forward is timed.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)


class Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        rows, cols = x.shape
        block = triton.next_power_of_2(cols)
        softmax_rows[(rows,)](x, y, cols, BLOCK=block, num_warps=16 if block >= 8192 else 8)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return y * (grad - (grad * y).sum(dim=1, keepdim=True))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return Softmax.apply(x)
