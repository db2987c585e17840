# expected: pass
# ReLU as one TileLang kernel (backend: tilelang, detected from `import tilelang`). `tilelang.compile` lowers the
# kernel and builds it with nvcc on the first call of each input size, inside the judge's sandboxed evaluation and
# before anything is timed. Its backward is PyTorch's own (an autograd Function masking the gradient).
import tilelang
import tilelang.language as T
import torch
import torch.nn as nn

BLOCK = 1024     # elements per thread block
THREADS = 256


def relu_program(n: int):
    @T.prim_func
    def relu(x: T.Tensor((n,), "float32"), y: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, BLOCK), threads=THREADS) as block:
            for i in T.Parallel(BLOCK):
                index = block * BLOCK + i
                if index < n:
                    y[index] = T.max(x[index], T.float32(0))

    return relu


_compiled = {}   # one compiled kernel per input size (its shapes are static)


def relu(x: torch.Tensor) -> torch.Tensor:
    x = x.contiguous().view(-1)
    y = torch.empty_like(x)
    n = x.numel()
    if n not in _compiled:
        _compiled[n] = tilelang.compile(relu_program(n), target="cuda")
    _compiled[n](x, y)
    return y


class Relu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = relu(x).view(x.shape)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (y > 0)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return Relu.apply(x)
