import torch
import torch.nn as nn

DESCRIPTION = "Three-layer MLP with ReLU"


class Model(nn.Module):
    """Linear -> ReLU -> Linear -> ReLU -> Linear."""

    def __init__(self, input_size, hidden_sizes, output_size):
        super().__init__()
        layers = []
        current = input_size
        for size in hidden_sizes:
            layers += [nn.Linear(current, size), nn.ReLU()]
            current = size
        layers.append(nn.Linear(current, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        return self.network(x)


batch_size = 2048
input_size = 4096
hidden_sizes = [4096, 4096]
output_size = 1024


def get_inputs():
    return [torch.randn(batch_size, input_size)]


def get_init_inputs():
    return [input_size, hidden_sizes, output_size]
