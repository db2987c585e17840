import torch
import torch.nn as nn

DESCRIPTION = "Batched fp32 matmul torch.bmm: (128, 512, 1024) @ (128, 1024, 512)"


class Model(nn.Module):
    """C[b] = A[b] @ B[b] for every batch index b."""

    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return torch.bmm(A, B)


batch_size = 128
M = 512
K = 1024
N = 512


def get_inputs():
    # Scaled so that outputs are O(1): fp32 rounding of any summation order stays well inside atol = 1e-4.
    scale = K ** -0.25
    return [torch.randn(batch_size, M, K) * scale, torch.randn(batch_size, K, N) * scale]


def get_init_inputs():
    return []
