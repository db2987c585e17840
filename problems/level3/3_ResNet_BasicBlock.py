import torch
import torch.nn as nn

DESCRIPTION = "ResNet basic block: conv3x3-BN-ReLU-conv3x3-BN + identity, ReLU (BatchNorm in training mode)"


class Model(nn.Module):
    """relu(bn2(conv2(relu(bn1(conv1(x))))) + x), stride 1, no downsampling."""

    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        with torch.no_grad():  # non-trivial affine parameters, so that ignoring them fails
            for bn in (self.bn1, self.bn2):
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + x)


batch_size = 32
channels = 128
height = 56
width = 56


def get_inputs():
    return [torch.randn(batch_size, channels, height, width)]


def get_init_inputs():
    return [channels]
