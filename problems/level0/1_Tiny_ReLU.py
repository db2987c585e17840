# Tiny CPU-sized problem for the demo and the CPU tests; not a benchmark.
import torch
import torch.nn as nn

DESCRIPTION = "Tiny ReLU (CPU smoke test, not a benchmark)"


class Model(nn.Module):
    """Elementwise ReLU."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


batch_size = 64
dim = 1024


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
