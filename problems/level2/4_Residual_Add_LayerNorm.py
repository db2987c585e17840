import torch
import torch.nn as nn

DESCRIPTION = "Residual add followed by LayerNorm (the post-norm transformer epilogue)"


class Model(nn.Module):
    """LayerNorm(x + residual)."""

    def __init__(self, hidden):
        super().__init__()
        self.ln = nn.LayerNorm(hidden, eps=1e-5)

    def forward(self, x, residual):
        return self.ln(x + residual)


batch_size = 24576  # 16384 gave 0.38 ms on an H200 (2026-11-21)
hidden = 4096


def get_inputs():
    return [torch.randn(batch_size, hidden), torch.randn(batch_size, hidden) * 0.5]


def get_init_inputs():
    return [hidden]
