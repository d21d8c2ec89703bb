"""`mhjax example2 --out DIR`: Example 2's minimax fidelities, example2.json and its figure
(mhjax/workflows/example2.py)."""

from __future__ import annotations

from mhjax.workflows.example2 import format_example2, run_example2


def command(args, overrides) -> int:
    print(format_example2(run_example2(args.out)))
    return 0
