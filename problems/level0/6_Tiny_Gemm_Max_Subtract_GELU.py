# A degenerate problem on purpose, shaped after KernelBench level2/80 but CPU-sized: the max over dim 1 leaves one
# column, its mean over dim 1 is that column itself, so the output is GELU(0) = 0 whatever the inputs. A correct
# answer writes zeros; its record carries `degenerate_problem`. For the CPU tests and the demo, not a benchmark.
import torch
import torch.nn as nn

DESCRIPTION = "Tiny Gemm + max + subtract mean + GELU: always zero (degenerate on purpose, not a benchmark)"


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


batch_size = 37
in_features = 48
out_features = 40
max_dim = 1


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, max_dim]
