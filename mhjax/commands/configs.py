"""`mhjax configs`: the bundled configs, a line each (the first line of each file's docstring)."""

from __future__ import annotations

import glob
import os

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def _summary(path: str) -> str:
    with open(path) as f:
        source = f.read().lstrip()
    return source[3:].split('"""', 1)[0].strip().splitlines()[0] if source.startswith('"""') else ""


def command(args, overrides) -> int:
    paths = sorted(glob.glob(os.path.join(CONFIG_DIR, "*.py")))
    shown = [os.path.relpath(p) if not os.path.relpath(p).startswith("..") else p for p in paths]  # as one types it
    width = max((len(s) for s in shown), default=0)
    for path, name in zip(paths, shown):
        print(f"{name:<{width}}  {_summary(path)}")
    return 0
