import torch
import torch.nn as nn

DESCRIPTION = "Conv2d 3x3 (no bias) -> BatchNorm2d (training mode, batch statistics) -> ReLU"


class Model(nn.Module):
    """relu(bn(conv(x))), the BatchNorm left in training mode as constructed."""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2, bias=False)
        self.bn = nn.BatchNorm2d(out_channels, eps=1e-5, momentum=0.1)
        with torch.no_grad():  # non-trivial affine parameters, so that ignoring them fails
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


batch_size = 32
in_channels = 64
out_channels = 128
kernel_size = 3
height = 128
width = 128


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
