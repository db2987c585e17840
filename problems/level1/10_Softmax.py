import torch
import torch.nn as nn

DESCRIPTION = "Row softmax over a wide fp32 matrix"


class Model(nn.Module):
    """Softmax over dim 1."""

    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


batch_size = 13312  # 8192 gave 0.34 ms on an H200 (2026-11-21)
dim = 16384


def get_inputs():
    return [torch.randn(batch_size, dim) * 4.0]


def get_init_inputs():
    return []
