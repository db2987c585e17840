import torch
import torch.nn as nn

DESCRIPTION = "Linear -> row softmax -> scale: a softmax epilogue over 4093 output features"

# Most outputs are below 1e-4 (median ~4e-5), so the default atol would not check them at all. fp32 softmax is
# accurate to ~1e-6 relative, so the output check is made relative (rtol 1e-4 dominates): PyTorch's fp32 output uses
# about 5% of this tolerance against float64. Gradients keep the default tolerance (weight gradients are O(0.1-10)).
ATOL = 1e-6


class Model(nn.Module):
    """softmax(x @ W^T + b, dim=1) * scale."""

    def __init__(self, in_features, out_features, scale):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        x = self.linear(x)
        x = torch.softmax(x, dim=1)
        return x * self.scale


batch_size = 4096
in_features = 2048
out_features = 4093
scale = 2.5


def get_inputs():
    # Logits have a standard deviation of about 2.3, so the softmax is far from uniform.
    return [torch.randn(batch_size, in_features) * 4.0]


def get_init_inputs():
    return [in_features, out_features, scale]
