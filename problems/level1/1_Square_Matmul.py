import torch
import torch.nn as nn

DESCRIPTION = "Square fp32 matrix multiplication C = A @ B (4096 x 4096)"


class Model(nn.Module):
    """C = A @ B for two square matrices."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


N = 4096


def get_inputs():
    # Scaled so that outputs are O(1): fp32 rounding of any summation order stays well inside atol = 1e-4.
    scale = N ** -0.25
    return [torch.randn(N, N) * scale, torch.randn(N, N) * scale]


def get_init_inputs():
    return []
