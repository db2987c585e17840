# KernelBench level 2, problem 80, kept as KernelBench has it although it is degenerate: the max over dim 1 (keepdim)
# leaves one column, the mean over dim 1 is that column itself, so the output is GELU(0) = 0 whatever the inputs
# (level0/6 is the same problem at CPU size). A correct answer writes zeros; its record carries `degenerate_problem`.
import torch
import torch.nn as nn

DESCRIPTION = "Linear -> max over dim 1 -> subtract mean -> GELU: always zero (KernelBench level 2, problem 80)"


class Model(nn.Module):
    """Linear, max over dim `max_dim` (keepdim), minus the mean over dim 1 (keepdim), GELU."""

    def __init__(self, in_features, out_features, max_dim):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features)
        self.max_dim = max_dim

    def forward(self, x):
        x = self.gemm(x)
        x = torch.max(x, dim=self.max_dim, keepdim=True).values
        x = x - x.mean(dim=1, keepdim=True)
        return torch.nn.functional.gelu(x)


batch_size = 1024
in_features = 8192
out_features = 8192
max_dim = 1


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, max_dim]
