"""A released ``{H}_heads_{task}.pt`` file read for analysis: its parameters and model sizes.

The restricted unpickler (:mod:`mhjax.io.torch_import`) does the reading; this module turns
what it rejects into the one-line :class:`mhjax.config.ConfigError` that names the option
(``--torch-checkpoint`` or ``--heads``), so the analysis never sees a torch file."""

from __future__ import annotations

import os

import numpy as np

from mhjax.config import ConfigError
from mhjax.io.torch_import import CheckpointFormatError, UnsafeCheckpointError, load_reference_params


def read_released(path, heads: int) -> tuple[dict, dict]:
    """(Flax params, sizes {vocab_size, max_len, num_layers, mlp_dim, width}) of one released file."""
    path = str(path)
    if not os.path.isfile(path):
        raise ConfigError(f"--torch-checkpoint: no such file: {path}")
    if isinstance(heads, bool) or not isinstance(heads, (int, np.integer)) or heads < 1:
        raise ConfigError(f"--heads: must be a positive integer, got {heads!r}")
    try:
        params, info = load_reference_params(path, num_heads=int(heads))
    except (CheckpointFormatError, UnsafeCheckpointError) as exc:
        option = "--heads" if "num_heads" in str(exc) else "--torch-checkpoint"
        raise ConfigError(f"{option}: {' '.join(str(exc).split())}") from None
    sizes = {k: info[k] for k in ("vocab_size", "max_len", "num_layers", "mlp_dim")}
    sizes["width"] = info["d_model"]
    return params, sizes
