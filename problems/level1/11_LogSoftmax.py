import torch
import torch.nn as nn

DESCRIPTION = "Row log-softmax over a wide fp32 matrix (row length not a multiple of the block size)"


class Model(nn.Module):
    """torch.log_softmax(x, dim=1)."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.log_softmax(x, dim=1)


batch_size = 12288
dim = 16381


def get_inputs():
    return [torch.randn(batch_size, dim) * 3.0]


def get_init_inputs():
    return []
