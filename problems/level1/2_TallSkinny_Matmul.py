import torch
import torch.nn as nn

DESCRIPTION = "Tall-skinny fp32 matmul: (32768 x 2048) @ (2048 x 512)"


class Model(nn.Module):
    """C = A @ B with many rows in A and a narrow B."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A, B)


M = 32768
K = 2048
N = 512


def get_inputs():
    # Scaled so that outputs are O(1): fp32 rounding of any summation order stays well inside atol = 1e-4.
    scale = K ** -0.25
    return [torch.randn(M, K) * scale, torch.randn(K, N) * scale]


def get_init_inputs():
    return []
