"""The Transformer's sizes as one frozen record (like the Flax lm1b example's TransformerConfig).

Built once, with keywords only, from a config's ``model`` section or a parameter tree's sizes,
and passed whole: no function takes width, mlp_dim and the rest as positional ints, so swapping
two of them is a TypeError instead of a different model."""

from __future__ import annotations

import dataclasses

from mhjax.models.transformer import Transformer

SIZE_KEYS = ("vocab_size", "max_len", "width", "num_layers", "mlp_dim")  # analysis.json's "model", in order
# A size present only where it differs from the width (a fixed head size): sizes dicts of
# parameter-matched models stay as they were.
ATTENTION_WIDTH = "attention_width"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelConfig:
    vocab_size: int
    max_len: int
    width: int
    num_layers: int
    mlp_dim: int
    dropout: float = 0.0
    # q, k and v's width A = heads x head size; None: the width (parameter matching, head size
    # width / heads). Normalised: never equal to ``width`` (see ``with_attention_width``).
    attention_width: int | None = None
    # The activations' dtype, "float32" or "bfloat16" (models/precision.py); not a size: sizes()
    # and from_sizes leave it out, so analysis rebuilds a model in float32.
    dtype: str = "float32"

    def __post_init__(self):
        if self.attention_width == self.width:
            object.__setattr__(self, "attention_width", None)

    @property
    def attention(self) -> int:
        """The attention width A (the width under parameter matching)."""
        return self.attention_width or self.width

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
            dtype=model.get("dtype", "float32"),
        )

    @classmethod
    def from_sizes(cls, sizes: dict) -> ModelConfig:
        """From the sizes dict of :func:`mhjax.models.probe.model_sizes` (eval mode: no dropout)."""
        extra = {ATTENTION_WIDTH: int(sizes[ATTENTION_WIDTH])} if sizes.get(ATTENTION_WIDTH) else {}
        return cls(**{k: int(sizes[k]) for k in SIZE_KEYS}, **extra)

    def sizes(self) -> dict[str, int]:
        """SIZE_KEYS' values, and ``attention_width`` where it differs from the width."""
        extra = {ATTENTION_WIDTH: self.attention_width} if self.attention_width else {}
        return {**{k: getattr(self, k) for k in SIZE_KEYS}, **extra}

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
            attention_width=self.attention_width,
            dtype=self.dtype,
        )
