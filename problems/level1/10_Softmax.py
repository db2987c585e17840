import torch
import torch.nn as nn

DESCRIPTION = "Row softmax over a wide fp32 matrix"
# Most outputs are ~1e-5 to 1e-4, under the default atol of 1e-4, where any value would pass. The positive control's
# largest error was 3.6e-7 (H200, 2026-11-21), so 1e-6 still admits correct kernels.
ATOL = 1e-6


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
