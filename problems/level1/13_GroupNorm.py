import torch
import torch.nn as nn

DESCRIPTION = "GroupNorm (32 groups) over NCHW activations, with affine weight and bias"


class Model(nn.Module):
    """nn.GroupNorm(num_groups, num_channels) with non-trivial affine parameters."""

    def __init__(self, num_groups, num_channels):
        super().__init__()
        self.gn = nn.GroupNorm(num_groups, num_channels, eps=1e-5)
        with torch.no_grad():  # so that a kernel ignoring the affine transform fails
            self.gn.weight.uniform_(0.5, 1.5)
            self.gn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.gn(x)


batch_size = 32
num_channels = 256
num_groups = 32
height = 161  # odd spatial size: each group holds 8 * 161 * 161 elements
width = 161


def get_inputs():
    return [torch.randn(batch_size, num_channels, height, width) * 2.0 + 0.5]


def get_init_inputs():
    return [num_groups, num_channels]
