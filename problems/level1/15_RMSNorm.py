import torch
import torch.nn as nn

DESCRIPTION = "RMSNorm over the last dimension with a learned scale"


class Model(nn.Module):
    """x * rsqrt(mean(x^2, -1) + eps) * weight."""

    def __init__(self, hidden, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden) + 0.1 * torch.randn(hidden))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps) * self.weight


batch_size = 16384
hidden = 8192


def get_inputs():
    return [torch.randn(batch_size, hidden)]


def get_init_inputs():
    return [hidden]
