"""What the planner reads of a sweep: plain shapes, handed over by the experiment.

The planner (``mhjax.plan``) knows no experiment class. An experiment whose members are
Transformers hands it a ``SweepShapes`` (``Experiment.sweep_shapes``): per member its model's
sizes and head count, its shape groups (members that share programs), and the config's settings
that the attention path, the memory and the cost depend on. An experiment without one (None: the
mixture) is planned as it lays itself out, and described by XLA's account of its compiled chunks.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from mhjax.models import count_params
from mhjax.models.model_config import ModelConfig


class Group(NamedTuple):
    """Members of one model (parameter shapes and dropout): ``name`` labels the group in program
    names ("" for a sweep of one group), ``members`` are indices into the sweep's members."""

    name: str
    model: ModelConfig
    members: list[int]


class SweepShapes(NamedTuple):
    models: list[ModelConfig]  # per member, in member order
    heads: list[int]  # per member
    groups: list[Group]
    batch: int  # data.batch_size
    seq_len: int
    vocab: int
    dtype: str  # model.dtype
    dropout: float  # model.dropout (attention dropout: the TPU kernel's condition)
    attention: str  # config.attention as asked for

    def traced(self, strategy: str) -> bool:
        """Whether ``strategy`` traces head counts (fused over several in one shape group)."""
        return strategy == "fused" and any(len({self.heads[i] for i in g.members}) > 1 for g in self.groups)

    def alike(self) -> list[tuple[int, int]]:
        """(one member's index, how many) per distinct model and head count: a member's memory and
        parameters depend on nothing else, so each is computed once per distinct shape."""
        counts: dict = {}
        for i, (model, heads) in enumerate(zip(self.models, self.heads)):
            counts.setdefault((model, heads), [i, 0])[1] += 1
        return [(i, n) for i, n in counts.values()]

    def params(self, index: int) -> int:
        return param_count(self.models[index], self.heads[index])


@functools.cache
def param_count(model: ModelConfig, heads: int) -> int:
    """The ``heads``-head Transformer's parameter count, traced once per distinct model: the dry
    run and results.json ask for every member (hundreds, a few distinct shapes; ~0.5 s a trace)."""
    module = model.transformer(heads)
    tokens = jnp.zeros((1, model.max_len), jnp.int32)
    shapes = jax.eval_shape(lambda: module.init(jax.random.PRNGKey(0), tokens))
    return count_params(shapes["params"])
