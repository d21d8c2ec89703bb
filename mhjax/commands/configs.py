"""`mhjax configs`: the bundled configs, a line each (the first line of each file's docstring)."""

from __future__ import annotations

import glob
import os

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def command(args, overrides) -> int:
    for path in sorted(glob.glob(os.path.join(CONFIG_DIR, "*.py"))):
        doc = ""
        with open(path) as f:
            source = f.read()
        if source.lstrip().startswith('"""'):
            doc = source.lstrip()[3:].split('"""', 1)[0].strip().splitlines()[0]
        print(f"{os.path.relpath(path):<28} {doc}")
    return 0
