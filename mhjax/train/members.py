"""Sweep members and their keys: the cartesian product of the config's `sweep` fields.

A member is one training run (task, heads, seed, learning rate, ...). Its PRNG keys
derive from (config.seed, member seed, its key name) and never from its position in
the sweep, so a member trained alone draws bit for bit what it draws inside any sweep (its
training is equal to float32 round-off across programs: docs/sweeps.md). The key name
(:func:`key_names`) leaves out the fields that an experiment shares its random draws over
(a learning rate, a step size, a training-set size, an init scale).
"""

from __future__ import annotations

import dataclasses
import itertools
import zlib
from typing import Any

import jax
import numpy as np

from mhjax.config import ConfigError
from mhjax.train import threefry


@dataclasses.dataclass(frozen=True)
class Member:
    name: str
    hparams: dict[str, Any]  # swept values, e.g. {"task": "copy", "heads": 4, "seed": 0, "learning_rate": 1e-3}
    # The name an earlier mhjax gave this member, where it differs (a single-valued task parameter
    # was left out of it): a workdir trained then keeps its names (Experiment.keep_names).
    earlier: str | None = dataclasses.field(default=None, compare=False)

    def __getitem__(self, key):
        return self.hparams[key]

    def flat_hparams(self) -> dict[str, Any]:
        """hparams with nested dicts flattened to dotted names (``task_params.pairs``) and None
        as text: what TensorBoard's HParams dashboard can show."""
        out = {}
        for key, value in self.hparams.items():
            for name, v in value.items() if isinstance(value, dict) else [(None, value)]:
                out[f"{key}.{name}" if name is not None else key] = "None" if v is None else v
        return out


SHORT = {
    "heads": "h",
    "seed": "s",
    "learning_rate": "lr",
    "num_train": "n",
    "step_size": "eta",
    "init_tau": "tau",
    # architecture axes (experiments/architecture.py; docs/sweeps.md)
    "width": "w",
    "num_layers": "l",
    "mlp_dim": "m",
    "dropout": "p",
    "head_dim": "d",
}


def member_name(hparams: dict[str, Any], swept_many: set[str], leading: str | None) -> str:
    """e.g. copy-h8-s0; fields with a single value (other than heads/seed) are left out, and so is
    a value of None (a field's default mode, e.g. head_dim None: parameter matching)."""
    parts = [str(hparams[leading])] if leading else []
    for field, value in hparams.items():
        if field == leading or value is None:
            continue
        if field in ("heads", "seed") or field in swept_many:
            parts.append(
                f"{SHORT.get(field, field)}{value:g}"
                if isinstance(value, float)
                else f"{SHORT.get(field, field)}{value}"
            )
    return "-".join(parts)


def expand(sweep: dict[str, tuple], leading: str | None = None) -> list[Member]:
    """Cartesian product in the config's field order (first field varies slowest)."""
    fields = list(sweep.keys())
    for f in fields:
        values = list(sweep[f])
        if len({repr(v) for v in values}) != len(values):
            raise ConfigError(f"config.sweep.{f}: repeated values {tuple(values)!r}; each member must be distinct")
    swept_many = {f for f in fields if len(sweep[f]) > 1}
    members = []
    for values in itertools.product(*(tuple(sweep[f]) for f in fields)):
        hparams = dict(zip(fields, values))
        members.append(Member(member_name(hparams, swept_many, leading), hparams))
    names = [m.name for m in members]
    if len(set(names)) != len(names):
        raise ConfigError(
            f"config.sweep: member names collide ({', '.join(sorted({n for n in names if names.count(n) > 1}))})"
        )
    return members


def key_names(sweep: dict, members: list[Member], shared=(), leading: str | None = None) -> dict[str, str]:
    """{member name: the name its PRNG key derives from}: the member's name without the ``shared``
    fields. Members that differ only in those start from the same random draws (a comparison over
    them is paired, not confounded by another init), and a member draws what it draws alone
    whichever other values of those fields were swept beside it."""
    swept_many = {f for f in sweep if f not in shared and len(sweep[f]) > 1}
    return {
        m.name: member_name({k: v for k, v in m.hparams.items() if k in sweep and k not in shared}, swept_many, leading)
        for m in members
    }


def stable_id(text: str) -> int:
    """A 31-bit id of a string that is the same on every run and machine."""
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def derive_key(root_seed: int, *parts) -> np.ndarray:
    """uint32[2] key data: fold_in of the root key with each part (ints or strings). Computed on
    the host (train/threefry.py: the same bits, no dispatch per fold) where JAX's keys are
    threefry2x32's and the numbers are in its range; otherwise by jax.random."""
    data = [stable_id(part) if isinstance(part, str) else int(part) for part in parts]
    if threefry.exact() and 0 <= int(root_seed) < 2**31 and all(0 <= d <= threefry.MASK for d in data):
        words = threefry.key(int(root_seed))
        for d in data:
            words = threefry.fold_in(words, d)
        return np.array(words, dtype=np.uint32)
    key = jax.random.PRNGKey(root_seed)
    for d in data:
        key = jax.random.fold_in(key, d)
    return np.asarray(key)
