"""`mhjax configs`: the bundled configs, a line each (the first line of each file's docstring;
mhjax/workflows/configs.py: they live in a checkout's configs/ folder)."""

from __future__ import annotations

import os

from mhjax.workflows.configs import bundled_configs


def command(args, overrides) -> int:
    found = bundled_configs()
    shown = [os.path.relpath(p) if not os.path.relpath(p).startswith("..") else p for p, _ in found]  # as one types it
    width = max((len(s) for s in shown), default=0)
    for (_, summary), name in zip(found, shown):
        print(f"{name:<{width}}  {summary}")
    return 0
