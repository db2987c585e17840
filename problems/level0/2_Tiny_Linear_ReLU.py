# Tiny CPU-sized problem for the demo and the CPU tests; not a benchmark.
import torch
import torch.nn as nn

DESCRIPTION = "Tiny Linear + ReLU (CPU smoke test, not a benchmark)"


class Model(nn.Module):
    """Linear layer followed by ReLU."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return torch.relu(self.linear(x))


batch_size = 64
in_features = 256
out_features = 128


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
