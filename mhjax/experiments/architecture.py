"""Architecture axes of a sequence sweep: width, layers, MLP width, dropout and head size.

``config.sweep`` may sweep any of FIELDS beside task, heads, seed and learning_rate; a field it
leaves out is ``config.model``'s for every member. ``model.head_dim`` (optional, default None)
chooses how heads are sized:
- None: parameter matching, as the paper: head size = width / heads, so q, k, v and the output
  projection are width x width whatever the head count;
- an int: a fixed head size, so the attention width A = heads x head_dim grows with the head
  count, while ``model.width`` stays the residual width (q, k, v: width x A; the output
  projection maps A back to the width).

A member's name carries the architecture fields swept over more than one value, after its task
and before its head count: ``copy-d16-h8-s0``, ``copy-w128-h4-s0`` (LETTERS; docs/sweeps.md). A
head_dim of None (parameter matching) names nothing, so those members keep today's names.
Architecture fields stay out of every PRNG key name, as learning_rate and task parameters do:
members that differ only in architecture see the same data and the same init key (paired), and a
member draws what it draws alone (docs/sweeps.md: what a member equals in another sweep).

Members whose models differ in shape (or dropout, a static setting) cannot share one vmapped
program: ``shape_groups`` splits a sweep into groups of one model each, and each strategy runs
within a group (experiments/sequence_programs.py). At a fixed head size every head count has its
own attention width, so its own group; members H x d = H' x d' share one.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

from mhjax import config as cfg
from mhjax.models.model_config import ModelConfig
from mhjax.models.precision import DEFAULT as DTYPE_DEFAULT
from mhjax.train.members import SHORT, Member

FIELDS = ("width", "num_layers", "mlp_dim", "dropout", "head_dim")  # in member names' order
LETTERS = {f: SHORT[f] for f in FIELDS}  # w, l, m, p, d
HEAD_DIM = "model.head_dim"


def head_dim(config):
    """config.model.head_dim, or its default None (parameter matching)."""
    return config.model.get("head_dim", None)


def swept(config) -> tuple[str, ...]:
    """The architecture fields config.sweep sets, in FIELDS order."""
    return tuple(f for f in FIELDS if f in config.sweep)


def ordered_sweep(config) -> dict:
    """config.sweep as a dict with its architecture fields right after ``task`` (FIELDS order), so
    that names read task, architecture, heads, seed; without them, config.sweep's own order."""
    fields = dict(config.sweep)
    arch = {f: fields.pop(f) for f in swept(config)}
    if not arch:
        return fields
    first = {k: fields.pop(k) for k in ("task",) if k in fields}
    return {**first, **arch, **fields}


def member_values(config, member: Member) -> dict:
    """{field: the member's value} for every architecture field (swept or config.model's)."""
    model = config.model
    return {f: member.hparams[f] if f in member.hparams else cfg.optional(model, f) for f in FIELDS}


def attention_width(width: int, heads: int, size) -> int:
    """A = heads x head size, or the width under parameter matching (``size`` None)."""
    return width if size is None else heads * size


def member_model(config, member: Member) -> ModelConfig:
    """The member's model: config.model with its swept architecture values."""
    v, m = member_values(config, member), config.model
    return ModelConfig(
        vocab_size=m.vocab_size,
        max_len=m.seq_len,
        width=v["width"],
        num_layers=v["num_layers"],
        mlp_dim=v["mlp_dim"],
        dropout=v["dropout"],
        attention_width=attention_width(v["width"], member["heads"], v["head_dim"]),
        dtype=cfg.optional(m, "dtype", DTYPE_DEFAULT),
    )


def record_sizes(model: dict, record: dict) -> dict:
    """The eval-mode sizes (models/model_config.SIZE_KEYS, attention_width where set) of a
    results.json ``record`` from the run's config ``model`` section (a dict): its swept values
    where the record carries them."""
    value = lambda f: record.get(f, model.get(f))  # noqa: E731
    width = value("width")
    sizes = ModelConfig(
        vocab_size=model["vocab_size"],
        max_len=model["seq_len"],
        width=width,
        num_layers=value("num_layers"),
        mlp_dim=value("mlp_dim"),
        attention_width=attention_width(width, int(record["heads"]), value("head_dim")),
    )
    return sizes.sizes()


def _check_value(field: str, value) -> None:
    where = f"config.{field}"
    name = field.split(".")[-1]
    if name == "dropout":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 <= value < 1.0
        allowed = "a number in [0, 1)"
    elif name == "head_dim":
        ok = value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0)
        allowed = "None (head size = width / heads) or a positive integer"
    else:
        ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
        allowed = "a positive integer"
    if not ok:
        raise cfg.ConfigError(f"{where}: each must be {allowed}; got {value!r}")


def validate(config) -> None:
    """ConfigError naming the first bad value or combination: a swept architecture value out of
    range, model.head_dim neither None nor positive, or a head count that does not divide a width
    it meets under parameter matching."""
    if "head_dim" in config.model:
        value = head_dim(config)
        if not (value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0)):
            raise cfg.ConfigError(
                f"config.{HEAD_DIM}: must be None (head size = width / heads) or a positive integer; got {value!r}"
            )
    for field in swept(config):
        for value in cfg.require_nonempty_tuple(config, f"sweep.{field}"):
            _check_value(f"sweep.{field}", value)
    heads = cfg.require_nonempty_tuple(config, "sweep.heads")
    for h in heads:
        if isinstance(h, bool) or not isinstance(h, int) or h <= 0:
            raise cfg.ConfigError(f"config.sweep.heads: each must be a positive integer; got {h!r}")
    widths = tuple(config.sweep.width) if "width" in config.sweep else (config.model.width,)
    sizes = tuple(config.sweep.head_dim) if "head_dim" in config.sweep else (head_dim(config),)
    for width, size, h in itertools.product(widths, sizes, heads):
        if size is None and width % h:
            allowed = ", ".join(str(d) for d in range(1, width + 1) if width % d == 0)
            if widths == (config.model.width,) and "width" not in config.sweep and sizes == (None,):
                raise cfg.ConfigError(
                    f"config.sweep.heads: each must divide model.width={width} (allowed: {allowed}); got {h!r}"
                )
            raise cfg.ConfigError(
                f"config.sweep.heads: {h} heads at width {width} with head_dim None (head size = width / heads) "
                f"do not divide it (allowed there: {allowed}; or set a head_dim)"
            )


class ShapeGroup(NamedTuple):
    """Members of one model (parameter shapes and dropout): ``name`` labels the group in program
    names ("" when the sweep has one group), ``model`` is its ModelConfig, ``members`` the
    indices in the experiment's members (member order)."""

    name: str
    model: ModelConfig
    members: list[int]


GROUP_LABELS = (("width", "w"), ("num_layers", "l"), ("mlp_dim", "m"), ("dropout", "p"), ("attention", "a"))


def shape_groups(config, members: list[Member]) -> list[ShapeGroup]:
    """The sweep's members grouped by model (every member of a group has the same parameter
    shapes and dropout), ordered by width, layers, MLP width, dropout and attention width. A group's
    name lists the sizes that tell it from the others (e.g. ``a32``, ``w64-a16``): stable for a
    given set of groups and unique; a sweep of one group has the name ""."""
    by_model: dict[ModelConfig, list[int]] = {}
    for i, member in enumerate(members):
        by_model.setdefault(member_model(config, member), []).append(i)
    key = lambda m: tuple(getattr(m, f) for f, _ in GROUP_LABELS)  # noqa: E731
    models = sorted(by_model, key=key)
    # the attention width labels groups where a fixed head size sets it (a width sweep alone: w16, w32)
    told = lambda m, f: m.attention_width if f == "attention" else getattr(m, f)  # noqa: E731
    differing = [(f, letter) for f, letter in GROUP_LABELS if len({told(m, f) for m in models}) > 1]
    out = []
    for model in models:
        name = "-".join(f"{letter}{_text(getattr(model, f))}" for f, letter in differing)
        out.append(ShapeGroup(name, model, by_model[model]))
    return out


def _text(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def head_sizes(group: ShapeGroup, members: list[Member]) -> list[int]:
    """The head sizes A / H of a group's members, ascending."""
    return sorted({group.model.attention // members[i]["heads"] for i in group.members})


def fine_heads(group: ShapeGroup, members: list[Member]) -> int:
    """The finest head count of a group: a multiple of each member's, dividing the attention width."""
    return math.lcm(*(members[i]["heads"] for i in group.members))
