import torch
import torch.nn as nn
import torch.nn.functional as F

DESCRIPTION = "Pre-norm transformer encoder block: LN -> multi-head self-attention -> residual, LN -> GELU MLP -> residual"


class Model(nn.Module):
    """x = x + MHA(LN1(x)); x = x + MLP(LN2(x)); no dropout, no mask."""

    def __init__(self, d_model, num_heads, mlp_hidden):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model, eps=1e-5)
        self.attn = nn.MultiheadAttention(d_model, num_heads, dropout=0.0, bias=True, batch_first=True)
        self.ln2 = nn.LayerNorm(d_model, eps=1e-5)
        self.fc1 = nn.Linear(d_model, mlp_hidden)
        self.fc2 = nn.Linear(mlp_hidden, d_model)

    def forward(self, x):
        h = self.ln1(x)
        attn_out, _ = self.attn(h, h, h, need_weights=False)
        x = x + attn_out
        h = self.ln2(x)
        h = self.fc2(F.gelu(self.fc1(h)))
        return x + h


batch_size = 16
seq_len = 512
d_model = 1024
num_heads = 16
mlp_hidden = 4096


def get_inputs():
    return [torch.randn(batch_size, seq_len, d_model)]


def get_init_inputs():
    return [d_model, num_heads, mlp_hidden]
