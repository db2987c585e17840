import torch
import torch.nn as nn

DESCRIPTION = "Linear -> sigmoid -> sum over features (keepdim): a GEMM with a row-reduction epilogue"


class Model(nn.Module):
    """sigmoid(x @ W^T + b).sum(dim=1, keepdim=True)."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        x = torch.sigmoid(x)
        return torch.sum(x, dim=1, keepdim=True)


batch_size = 8192
in_features = 2048
out_features = 2047


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
