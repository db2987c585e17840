# KernelBench level 2, problem 51. The mean over the GEMM's output features collapses the GEMM: the mean of
# x . w_o + b_o - s_o over o is x . mean_o(w_o) + mean(b - s), one GEMV with column-averaged weights. The logsumexp
# then runs over a single column (the identity), so a correct answer reads the weights once instead of doing the GEMM.
import torch
import torch.nn as nn

DESCRIPTION = "Linear - subtract -> mean over features -> logsumexp -> GELU + input (KernelBench level 2, problem 51)"


class Model(nn.Module):
    """Linear, minus a learned vector, mean over the features (keepdim), logsumexp over that one column, GELU, then
    the input (detached) added back, broadcast over its features."""

    def __init__(self, in_features, out_features, bias=True):
        super().__init__()
        self.gemm = nn.Linear(in_features, out_features, bias=bias)
        self.subtract = nn.Parameter(torch.randn(out_features))

    def forward(self, x):
        residual = x.clone().detach()
        x = self.gemm(x)
        x = x - self.subtract
        x = torch.mean(x, dim=1, keepdim=True)
        x = torch.logsumexp(x, dim=1, keepdim=True)
        x = torch.nn.functional.gelu(x)
        return x + residual


batch_size = 2048
in_features = 8192
out_features = 8192


def get_inputs():
    return [torch.rand(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
