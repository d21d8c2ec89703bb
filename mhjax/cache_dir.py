"""mhjax's per-user cache folder: where io/compile_cache.py keeps XLA's compiled programs and
models/cpu_attention.py builds its C++ kernel (both layers may import this module).

``$MHJAX_CACHE_DIR`` when set and not empty, else ``$XDG_CACHE_HOME/mhjax`` (default
``~/.cache/mhjax``)."""

from __future__ import annotations

import os

ENV = "MHJAX_CACHE_DIR"


def cache_root() -> str:
    """mhjax's per-user cache folder."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get(ENV) or os.path.join(base, "mhjax")
