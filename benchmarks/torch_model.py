"""The paper's Transformer and training step in PyTorch, for benchmarks/throughput.py.

The same model as mhjax.models.Transformer: pre-norm blocks with RMSNorm (eps = float32
machine epsilon), biases everywhere, dropout on the attention probabilities and after the
MLP, learned token and position embeddings, no final norm, a linear read-out. Initialisation
is PyTorch's default, which is what mhjax copies: Linear weights and biases
U(+-1/sqrt(fan_in)), embeddings N(0, 1). Training: Adam (0.9, 0.999, eps 1e-8), cross
entropy on the copy task (targets = inputs), a fresh random batch every step.

Attention is F.scaled_dot_product_attention (is_causal, dropout_p): on the CPU with
dropout it runs PyTorch's math path (matmul, softmax, dropout, matmul), and it was the
faster of that and a hand-written version here (``attention="manual"``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

RMS_EPS = float(np.finfo(np.float32).eps)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, dropout: float, impl: str = "sdpa"):
        super().__init__()
        self.heads, self.dropout, self.impl = heads, dropout, impl
        self.query, self.key, self.value, self.out = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x):
        batch, length, width = x.shape
        split = lambda t: t.view(batch, length, self.heads, width // self.heads).transpose(1, 2)  # noqa: E731
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        p = self.dropout if self.training else 0.0
        if self.impl == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        else:
            scores = q @ k.transpose(-1, -2) / math.sqrt(width // self.heads)
            causal = torch.ones(length, length, dtype=torch.bool, device=x.device).tril()
            probs = F.dropout(scores.masked_fill(~causal, float("-inf")).softmax(-1), p, self.training)
            out = probs @ v
        return self.out(out.transpose(1, 2).reshape(batch, length, width))


class Block(nn.Module):
    def __init__(self, width, heads, mlp_dim, dropout, impl):
        super().__init__()
        self.ln1 = nn.RMSNorm(width, eps=RMS_EPS)
        self.attn = Attention(width, heads, dropout, impl)
        self.ln2 = nn.RMSNorm(width, eps=RMS_EPS)
        self.mlp_in, self.mlp_out = nn.Linear(width, mlp_dim), nn.Linear(mlp_dim, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.mlp_out(F.relu(self.mlp_in(self.ln2(x)))))


class Transformer(nn.Module):
    def __init__(
        self, vocab_size=256, max_len=100, width=64, num_layers=4, mlp_dim=128, heads=1, dropout=0.1, impl="sdpa"
    ):
        super().__init__()
        self.token_emb = nn.Embedding(vocab_size, width)  # N(0, 1) by default
        self.pos_emb = nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(Block(width, heads, mlp_dim, dropout, impl) for _ in range(num_layers))
        self.readout = nn.Linear(width, vocab_size)

    def forward(self, tokens):
        x = self.token_emb(tokens) + self.pos_emb(torch.arange(tokens.shape[-1], device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.readout(x)


class Trainer:
    """One member: model, Adam, and a copy-task step on a fresh random batch."""

    def __init__(
        self,
        heads,
        *,
        vocab_size=256,
        length=100,
        width=64,
        num_layers=4,
        mlp_dim=128,
        dropout=0.1,
        batch_size=50,
        learning_rate=1e-3,
        seed=0,
        impl="sdpa",
    ):
        torch.manual_seed(seed)
        self.model = Transformer(vocab_size, length, width, num_layers, mlp_dim, heads, dropout, impl).train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=learning_rate, betas=(0.9, 0.999), eps=1e-8)
        self.generator = torch.Generator().manual_seed(seed)
        self.batch_size, self.length, self.vocab = batch_size, length, vocab_size
        self.last_loss = float("nan")

    def step(self) -> torch.Tensor:
        tokens = torch.randint(0, self.vocab, (self.batch_size, self.length), generator=self.generator)
        logits = self.model(tokens)
        loss = F.cross_entropy(logits.reshape(-1, self.vocab), tokens.reshape(-1))
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss

    def run(self, steps: int) -> float:
        for _ in range(steps):
            loss = self.step()
        self.last_loss = float(loss.detach())
        return self.last_loss


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
