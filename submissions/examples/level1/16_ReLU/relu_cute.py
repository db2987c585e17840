# expected: pass
# ReLU as one CuTe DSL kernel (backend: cute, detected from `import cutlass`). The DSL compiles the kernel on the
# first call of each input size, inside the judge's sandboxed evaluation and before anything is timed, and launches
# it on torch's current stream. Its backward is PyTorch's own (an autograd Function masking the gradient).
import cuda.bindings.driver as cuda
import cutlass
import cutlass.cute as cute
import torch
import torch.nn as nn
from cutlass.cute.runtime import from_dlpack

THREADS = 256


@cute.kernel
def relu_kernel(x: cute.Tensor, y: cute.Tensor, n: cutlass.Int32):
    thread, _, _ = cute.arch.thread_idx()
    block, _, _ = cute.arch.block_idx()
    i = block * THREADS + thread
    if i < n:
        y[i] = cute.arch.fmax(x[i], cutlass.Float32(0.0))


@cute.jit
def relu_launch(x: cute.Tensor, y: cute.Tensor, n: cutlass.Int32, stream: cuda.CUstream):
    relu_kernel(x, y, n).launch(grid=(cute.ceil_div(n, THREADS), 1, 1), block=(THREADS, 1, 1), stream=stream)


_compiled = {}   # one compiled launcher per input size (the tensors' layouts are static)


def relu(x: torch.Tensor) -> torch.Tensor:
    x = x.detach().contiguous().view(-1)   # DLPack exports no tensor that requires grad
    y = torch.empty_like(x)
    n = x.numel()
    args = (from_dlpack(x, assumed_align=16), from_dlpack(y, assumed_align=16), n,
            cuda.CUstream(torch.cuda.current_stream().cuda_stream))
    if n not in _compiled:
        _compiled[n] = cute.compile(relu_launch, *args)
    _compiled[n](*args)
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
