import torch
import torch.nn as nn

DESCRIPTION = "Depthwise 3x3 convolution (groups = channels), padding 1, with bias; memory-bound"


class Model(nn.Module):
    """nn.Conv2d(channels, channels, 3, padding=1, groups=channels)."""

    def __init__(self, channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, kernel_size, stride=1, padding=kernel_size // 2,
                              groups=channels, bias=True)

    def forward(self, x):
        return self.conv(x)


batch_size = 16
channels = 256
kernel_size = 3
height = 227  # odd spatial size: border and tail handling are exercised
width = 227


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels, kernel_size]
