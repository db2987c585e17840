import torch
import torch.nn as nn

DESCRIPTION = "fp32 matmul with a transposed left operand: C = A.T @ B, A stored as (K, M)"


class Model(nn.Module):
    """C = A.T @ B where A has shape (K, M) and B has shape (K, N)."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.matmul(A.T, B)


M = 2048
K = 8192
N = 2048


def get_inputs():
    # Scaled so that outputs are O(1): fp32 rounding of any summation order stays well inside atol = 1e-4.
    scale = K ** -0.25
    return [torch.randn(K, M) * scale, torch.randn(K, N) * scale]


def get_init_inputs():
    return []
