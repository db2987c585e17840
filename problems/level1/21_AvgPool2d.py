import torch
import torch.nn as nn

DESCRIPTION = "AvgPool2d, 3x3 window, stride 2, padding 1 (zero padding counted in the average)"


class Model(nn.Module):
    """nn.AvgPool2d(kernel_size, stride, padding) with the default count_include_pad=True."""

    def __init__(self, kernel_size, stride, padding):
        super().__init__()
        self.pool = nn.AvgPool2d(kernel_size=kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        return self.pool(x)


batch_size = 64
channels = 64
height = 277
width = 273
kernel_size = 3
stride = 2
padding = 1


def get_inputs():
    return [torch.randn(batch_size, channels, height, width) + 0.5]


def get_init_inputs():
    return [kernel_size, stride, padding]
