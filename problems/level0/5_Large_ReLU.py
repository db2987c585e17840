# CPU problem large enough that memory bandwidth bounds it: the roofline floor (16 MB in, 16 MB out) is a few
# milliseconds on CPU, so an answer replayed from a cache shows up as implausibly fast. Not a benchmark.
import torch
import torch.nn as nn

DESCRIPTION = "ReLU over 4M floats (CPU roofline test, not a benchmark)"


class Model(nn.Module):
    """Elementwise ReLU."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


batch_size = 4096
dim = 1024


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return []
