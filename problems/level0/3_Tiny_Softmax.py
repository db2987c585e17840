# Tiny CPU-sized problem for the demo and the CPU tests; not a benchmark.
import torch
import torch.nn as nn

DESCRIPTION = "Tiny row softmax (CPU smoke test, not a benchmark)"


class Model(nn.Module):
    """Softmax over the last dimension."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=-1)


batch_size = 64
dim = 512


def get_inputs():
    return [torch.randn(batch_size, dim) * 3.0]


def get_init_inputs():
    return []
