"""Example 2 of 'Beyond Parallelism' (``mhjax example2 --out DIR``): its minimax fidelities,
example2.json and its figure."""

from __future__ import annotations

import json
from pathlib import Path

from mhjax.analysis.example2 import EXPECTED, HORIZON, NODES, example2
from mhjax.plotting.example2 import plot_example2


def run_example2(out_dir, horizon: int = HORIZON, plot: bool = True) -> dict:
    """Compute the three minimax fidelities, write ``example2.json`` and ``example2.png``.

    Returns a dict with ``minimax`` (fractions per operator, min over u, v, w),
    ``expected``, ``combined_beats_both`` and the file paths.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    computed = example2(horizon)
    minimax = computed["minimax"]
    result = {
        "horizon": horizon,
        "nodes": list(NODES),
        "minimax": minimax,
        "minimax_percent": {k: 100.0 * v for k, v in minimax.items()},
        "expected": EXPECTED,
        "combined_beats_both": computed["combined_beats_both"],
        "operators": {k: A.tolist() for k, A in computed["operators"].items()},
        "json": str(out / "example2.json"),
    }
    if plot:
        result["png"] = str(out / "example2.png")
        plot_example2(computed["signals"], out / "example2.png")
    (out / "example2.json").write_text(json.dumps(result, indent=2))
    return result


def format_example2(result: dict) -> str:
    """Human-readable summary of :func:`run_example2`'s result."""
    m, e = result["minimax"], result["expected"]
    lines = [f"Example 2 minimax fidelity over t=1..{result['horizon']} (min over u, v, w):"]
    for k, label in (("head1", "head 1"), ("head2", "head 2"), ("multi_head", "multi-head")):
        lines.append(f"  {label:<10} {100 * m[k]:7.2f}%  (paper {100 * e[k]:.2f}%)")
    lines.append(f"  combined beats both heads: {result['combined_beats_both']}")
    return "\n".join(lines)
