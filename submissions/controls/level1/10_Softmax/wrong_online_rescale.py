# expected: incorrect
# Planted defect: a chunked ("online") softmax in Triton that forgets to rescale its running sum when a later
# chunk raises the running max. It walks the row in 4096-column chunks keeping (max m, sum s); the correct update
# is s = s * exp(m_old - m_new) + sum(exp(x - m_new)), this one drops the factor exp(m_old - m_new). Rows whose
# max lies in their first chunk come out right; every other row's sum is too large, so its outputs are too small.
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def softmax_rows(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    s = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s + tl.sum(tl.exp(x - m_new), axis=0)   # missing: s * exp(m - m_new)
        m = m_new
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf"))
        tl.store(y_ptr + row * n_cols + cols, tl.exp(x - m) / s, mask=cols < n_cols)


class Softmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        softmax_rows[(x.shape[0],)](x, y, x.shape[1], BLOCK=4096, num_warps=8)
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
