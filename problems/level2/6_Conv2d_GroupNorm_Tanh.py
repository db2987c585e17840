import torch
import torch.nn as nn

DESCRIPTION = "Conv2d 3x3 -> GroupNorm (16 groups) -> tanh"


class Model(nn.Module):
    """tanh(group_norm(conv(x)))."""

    def __init__(self, in_channels, out_channels, kernel_size, num_groups):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self.gn = nn.GroupNorm(num_groups, out_channels, eps=1e-5)
        with torch.no_grad():  # non-trivial affine parameters, so that ignoring them fails
            self.gn.weight.uniform_(0.5, 1.5)
            self.gn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        x = self.conv(x)
        x = self.gn(x)
        return torch.tanh(x)


batch_size = 32
in_channels = 64
out_channels = 128
kernel_size = 3
num_groups = 16
height = 126
width = 126


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, num_groups]
