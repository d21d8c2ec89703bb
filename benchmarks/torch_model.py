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

Two trainers, the two ways plain PyTorch trains a sweep:
- ``Trainer``: one model at a time, as the paper's reference code does;
- ``EnsembleTrainer``: the members of one head count at once, the strongest plain-PyTorch
  way: ``torch.func.stack_module_state`` + ``functional_call`` + ``vmap`` (randomness
  "different": every member draws its own dropout), one Adam over the stacked parameters.
  Head counts differ in shape, so a sweep runs one ensemble per head count, one after another.
"""

from __future__ import annotations

import copy
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
        device="cpu",
    ):
        self.model = init_model(seed, vocab_size, length, width, num_layers, mlp_dim, heads, dropout, impl, device)
        self.opt = adam(self.model.parameters(), learning_rate)
        self.generator = torch.Generator(device=device).manual_seed(seed)
        self.batch_size, self.length, self.vocab, self.device = batch_size, length, vocab_size, device
        self.last_loss = float("nan")

    def step(self) -> torch.Tensor:
        tokens = random_batch(self.generator, self.batch_size, self.length, self.vocab, self.device)
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


class EnsembleTrainer:
    """The members of one head count trained at once, one seed each: each member's model is
    initialised as ``Trainer(heads, seed=s)``'s and reads the batches of ``Trainer``'s
    generator for that seed, so member j follows ``Trainer(heads, seed=seeds[j])`` (tested
    without dropout; dropout masks are drawn differently). Adam is elementwise, so one Adam
    over the stacked parameters is each member's own Adam."""

    def __init__(
        self,
        heads,
        seeds=(0,),
        *,
        vocab_size=256,
        length=100,
        width=64,
        num_layers=4,
        mlp_dim=128,
        dropout=0.1,
        batch_size=50,
        learning_rate=1e-3,
        impl="auto",
        device="cpu",
    ):
        from torch.func import functional_call, stack_module_state, vmap

        if impl == "auto":
            impl = "sdpa" if torch.device(device).type == "cuda" else "manual"
        self.impl = impl
        models = [
            init_model(s, vocab_size, length, width, num_layers, mlp_dim, heads, dropout, impl, device) for s in seeds
        ]
        self.params, self.buffers = stack_module_state(models)  # leaves with a leading member axis
        self.members = len(models)
        base = copy.deepcopy(models[0]).to("meta")  # the structure only; parameters come stacked

        def member_loss(params, buffers, tokens):
            logits = functional_call(base, (params, buffers), (tokens,))
            return F.cross_entropy(logits.reshape(-1, vocab_size), tokens.reshape(-1))

        self.losses = vmap(member_loss, randomness="different")
        self.opt = adam(self.params.values(), learning_rate)
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.batch_size, self.length, self.vocab, self.device = batch_size, length, vocab_size, device
        self.last_loss = float("nan")

    def step(self) -> torch.Tensor:
        """One step of every member; returns the (members,) losses."""
        tokens = torch.stack(
            [random_batch(g, self.batch_size, self.length, self.vocab, self.device) for g in self.generators]
        )
        losses = self.losses(self.params, self.buffers, tokens)
        self.opt.zero_grad(set_to_none=True)
        losses.sum().backward()  # member j's parameters get exactly member j's gradient
        self.opt.step()
        return losses

    def run(self, steps: int) -> float:
        """``steps`` steps of every member; returns the members' mean last loss."""
        for _ in range(steps):
            losses = self.step()
        self.last_loss = float(losses.detach().mean())
        return self.last_loss

    def member_state(self, j: int) -> dict:
        """Member j's parameters, named as in ``Transformer.state_dict()``."""
        return {name: p[j].detach() for name, p in self.params.items()}


def init_model(seed, vocab_size, length, width, num_layers, mlp_dim, heads, dropout, impl, device) -> Transformer:
    torch.manual_seed(seed)
    model = Transformer(vocab_size, length, width, num_layers, mlp_dim, heads, dropout, impl)
    return model.to(device).train()


def adam(params, learning_rate) -> torch.optim.Adam:
    return torch.optim.Adam(params, lr=learning_rate, betas=(0.9, 0.999), eps=1e-8)


def random_batch(generator, batch_size, length, vocab, device) -> torch.Tensor:
    return torch.randint(0, vocab, (batch_size, length), generator=generator, device=device)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())
