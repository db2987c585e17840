import torch
import torch.nn as nn

DESCRIPTION = "MaxPool2d, 3x3 window, stride 2, padding 1, on odd-sized NCHW input"


class Model(nn.Module):
    """nn.MaxPool2d(kernel_size, stride, padding)."""

    def __init__(self, kernel_size, stride, padding):
        super().__init__()
        self.pool = nn.MaxPool2d(kernel_size=kernel_size, stride=stride, padding=padding)

    def forward(self, x):
        return self.pool(x)


batch_size = 32
channels = 128
height = 275  # odd: the last window is cut by the border
width = 275
kernel_size = 3
stride = 2
padding = 1


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [kernel_size, stride, padding]
