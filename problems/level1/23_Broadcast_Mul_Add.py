import torch
import torch.nn as nn

DESCRIPTION = "Broadcast elementwise x * y + z with a row vector y (1, D) and a column vector z (B, 1)"


class Model(nn.Module):
    """x * y + z, y broadcast over rows and z over columns."""

    def __init__(self):
        super().__init__()

    def forward(self, x, y, z):
        return x * y + z


batch_size = 16381
dim = 13331


def get_inputs():
    return [torch.randn(batch_size, dim), torch.randn(1, dim), torch.randn(batch_size, 1)]


def get_init_inputs():
    return []
