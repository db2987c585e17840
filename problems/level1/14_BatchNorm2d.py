import torch
import torch.nn as nn

DESCRIPTION = "BatchNorm2d in training mode (batch statistics), with affine weight and bias"


class Model(nn.Module):
    """nn.BatchNorm2d(num_features), left in training mode as constructed.

    The output uses the batch mean and biased batch variance; the running statistics it also updates are not
    part of the output.
    """

    def __init__(self, num_features):
        super().__init__()
        self.bn = nn.BatchNorm2d(num_features, eps=1e-5, momentum=0.1)
        with torch.no_grad():  # so that a kernel ignoring the affine transform fails
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.bn(x)


batch_size = 64
num_features = 128
height = 161
width = 161


def get_inputs():
    return [torch.randn(batch_size, num_features, height, width) * 2.0 + 0.5]


def get_init_inputs():
    return [num_features]
