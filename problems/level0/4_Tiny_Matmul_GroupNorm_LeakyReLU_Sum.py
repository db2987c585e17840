# Tiny CPU-sized version of level2/62 for the demo and the CPU tests; not a benchmark.
import torch
import torch.nn as nn

DESCRIPTION = "Tiny level2/62 (CPU smoke test, not a benchmark)"


class Model(nn.Module):
    """Linear -> GroupNorm -> LeakyReLU -> x + x, at CPU-friendly sizes."""

    def __init__(self, input_size, hidden_size, num_groups, eps=1e-5, negative_slope=0.01):
        super().__init__()
        self.fc = nn.Linear(input_size, hidden_size)
        self.gn = nn.GroupNorm(num_groups=num_groups, num_channels=hidden_size, eps=eps)
        self.leaky_relu = nn.LeakyReLU(negative_slope=negative_slope)

    def forward(self, x):
        x = self.fc(x)
        x = self.gn(x)
        x = self.leaky_relu(x)
        x = x + x
        return x


batch_size = 32
input_size = 64
hidden_size = 128
num_groups = 8


def get_inputs():
    return [torch.rand(batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_groups]
