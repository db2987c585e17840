import torch
import torch.nn as nn

DESCRIPTION = "Inclusive prefix sum (cumsum) along rows of length 4093"

# A sequential fp32 scan over 4093 elements legitimately lies up to ~3e-4 from the exact prefix sum where the sum
# passes near zero, which fails atol 1e-4; atol 1e-3 accepts any correct summation order (prefix sums are O(1-60)).
ATOL = 1e-3


class Model(nn.Module):
    """torch.cumsum(x, dim)."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.cumsum(x, dim=self.dim)


batch_size = 50000
dim = 4093
scan_dim = 1


def get_inputs():
    return [torch.randn(batch_size, dim)]


def get_init_inputs():
    return [scan_dim]
