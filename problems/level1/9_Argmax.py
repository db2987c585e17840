import torch
import torch.nn as nn

DESCRIPTION = "Argmax over the middle dimension of a 3D tensor (int64 indices, no gradient)"
CHECK_GRAD = False  # integer output: there is nothing to differentiate


class Model(nn.Module):
    """torch.argmax(x, dim)."""

    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return torch.argmax(x, dim=self.dim)


batch_size = 96
dim1 = 1021  # reduced dimension; not a multiple of any block size
dim2 = 4093
reduce_dim = 1


def get_inputs():
    return [torch.randn(batch_size, dim1, dim2)]


def get_init_inputs():
    return [reduce_dim]
