import torch
import torch.nn as nn
import torch.nn.functional as F

DESCRIPTION = "Linear (no bias) + separate bias add + GELU + scale: an epilogue to fuse after the GEMM"


class Model(nn.Module):
    """y = gelu(x @ W^T + b) * scale."""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, bias=False)
        self.bias = nn.Parameter(torch.randn(out_features) * 0.1)
        self.scale = scale

    def forward(self, x):
        x = self.linear(x)
        x = x + self.bias
        x = F.gelu(x)
        return x * self.scale


batch_size = 4096
in_features = 4096
out_features = 8192
scale = 1.5


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, scale]
