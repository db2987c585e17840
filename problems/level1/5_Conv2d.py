import torch
import torch.nn as nn

DESCRIPTION = "2D convolution, 3x3 kernel, stride 1, padding 1, with bias (NCHW fp32)"


class Model(nn.Module):
    """nn.Conv2d(in_channels, out_channels, 3, padding=1)."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, stride=1,
                              padding=kernel_size // 2, bias=True)

    def forward(self, x):
        return self.conv(x)


batch_size = 16
in_channels = 128
out_channels = 128
kernel_size = 3
height = 128
width = 128


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
