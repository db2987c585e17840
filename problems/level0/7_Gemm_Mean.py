# CPU problem whose reference does more work than the function needs: a GEMM and then a mean over its columns,
# which one pass over the weights plus a GEMV computes exactly (mean_o(x . w_o + b_o) = x . mean_o(w_o) + mean(b)).
# A correct candidate that does so beats the reference's roofline: the judge flags it, and does not fail it.
import torch
import torch.nn as nn

DESCRIPTION = "Linear then mean over the features (an algebraic shortcut beats its roofline; not a benchmark)"


class Model(nn.Module):
    """Linear layer, then the mean over its output features."""

    def __init__(self, in_features, out_features):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        return self.linear(x).mean(dim=1, keepdim=True)


batch_size = 256
in_features = 64         # a short inner dimension: the GEMM writes 16 MB of output for few FLOPs, and its roofline
out_features = 16384     # floor (FLOPs at the measured matmul rate) stays clearly below the reference's own time


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features]
