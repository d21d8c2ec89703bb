"""The Transformer's sizes as one frozen record (like the Flax lm1b example's TransformerConfig).

Built once, with keywords only, from a config's ``model`` section or a parameter tree's sizes,
and passed whole: no function takes width, mlp_dim and the rest as positional ints, so swapping
two of them is a TypeError instead of a different model."""

from __future__ import annotations

import dataclasses

from mhjax.models.transformer import Transformer

SIZE_KEYS = ("vocab_size", "max_len", "width", "num_layers", "mlp_dim")  # analysis.json's "model", in order


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    vocab_size: int
    max_len: int
    width: int
    num_layers: int
    mlp_dim: int
    dropout: float = 0.0

    @classmethod
    def from_config(cls, model) -> ModelConfig:
        """From a config's ``model`` section: the Transformer has ``max_len = seq_len``."""
        return cls(
            vocab_size=model.vocab_size,
            max_len=model.seq_len,
            width=model.width,
            num_layers=model.num_layers,
            mlp_dim=model.mlp_dim,
            dropout=model.dropout,
        )

    @classmethod
    def from_sizes(cls, sizes: dict) -> ModelConfig:
        """From the sizes dict of :func:`mhjax.models.probe.model_sizes` (eval mode: no dropout)."""
        return cls(**{k: int(sizes[k]) for k in SIZE_KEYS})

    def sizes(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in SIZE_KEYS}

    def transformer(
        self, heads: int, *, layout=None, attention: str = "jax", interpret: bool = False, scan_layers: bool = False
    ) -> Transformer:
        """The ``heads``-head Transformer of these sizes (see :class:`Transformer` for the rest)."""
        return Transformer(
            vocab_size=self.vocab_size,
            max_len=self.max_len,
            width=self.width,
            num_layers=self.num_layers,
            mlp_dim=self.mlp_dim,
            num_heads=heads,
            dropout_rate=self.dropout,
            layout=layout,
            attention=attention,
            interpret=interpret,
            scan_layers=scan_layers,
        )
