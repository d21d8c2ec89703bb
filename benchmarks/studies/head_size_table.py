"""The table of docs/head_size.md from a trained configs/head_size.py workdir: per task, head_dim
and head count, the held-out accuracy after the last step (mean ± population std over seeds, as
`mhjax report` prints it), each seed's first evaluation step at 99% held-out accuracy (- : not
reached), the seeds counted, the parameter count and GFLOP per training step.

    python benchmarks/studies/head_size_table.py --workdir runs/head_size [--figure steps_to_99.png]
        [--accuracy-figure accuracy.png]

Reads results.json and the members' TensorBoard curves (``eval/accuracy``) through mhjax.load.
A fixed head size d at H heads that the sweep skipped (config.sweep_skip) because it is the
parameter-matched model (width / H = d) takes that member's row, marked "= matched".
``--figure``: the steps to 99% of the tasks every seed learns (recall, induction) against heads,
one line per head_dim; ``--accuracy-figure``: held-out accuracy against heads, a panel per task
(both mhjax/plotting/architecture.py's figure of the report, with the shared points).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import mhjax  # noqa: E402

THRESHOLD = 0.99


def first_at(steps, values, threshold: float = THRESHOLD):
    """The first step whose value reaches ``threshold``; None if none does."""
    return next((int(s) for s, v in zip(steps, values) if v >= threshold), None)


def rows(run) -> dict:
    """{(task, head_dim, heads): [results entries with "reached"]}, seeds in order."""
    out = defaultdict(list)
    for m in sorted(run.results, key=lambda m: m["seed"]):
        steps, values = run.curves(m["name"])["eval/accuracy"]
        out[(m["task"], m.get("head_dim"), m["heads"])].append({**m, "reached": first_at(steps, values)})
    return shared(out, int(run.config.model.width))


def shared(groups: dict, width: int) -> dict:
    """``groups`` with each absent (task, d, H) whose model is the matched one at H (width / H
    = d) filled by that group's entries, marked ``"same_as": "matched"``."""
    out = dict(groups)
    sizes = {d for _, d, _ in groups if d is not None}
    for (task, head_dim, heads), members in groups.items():
        if head_dim is None and width % heads == 0 and width // heads in sizes:
            key = (task, width // heads, heads)
            if key not in out:
                out[key] = [{**m, "head_dim": width // heads, "same_as": "matched"} for m in members]
    return out


def markdown(groups: dict) -> str:
    lines = [
        "| task | head_dim | heads | seeds | params | GFLOP/step | accuracy % | steps to 99% (per seed) |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    order = lambda k: (k[0], k[1] is not None, k[1] or 0, k[2])  # noqa: E731
    for (task, head_dim, heads), members in sorted(groups.items(), key=lambda kv: order(kv[0])):
        acc = [100 * m["eval_accuracy"] for m in members]
        reached = ", ".join("-" if m["reached"] is None else str(m["reached"]) for m in members)
        size = "matched (64 / H)" if head_dim is None else str(head_dim)
        if members[0].get("same_as"):
            size += " (= matched)"
        lines.append(
            f"| {task} | {size} | {heads} | {len(members)} | {members[0]['params']:,} | "
            f"{members[0]['gflop_per_step']:.3f} | {statistics.fmean(acc):.1f} ± {statistics.pstdev(acc):.1f} | "
            f"{reached} |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--figure", help="PNG of the steps to 99%% against heads")
    parser.add_argument("--accuracy-figure", help="PNG of the held-out accuracy against heads")
    args = parser.parse_args(argv)
    groups = rows(mhjax.load(args.workdir))
    print(markdown(groups))
    from mhjax.plotting.architecture import plot_against_heads

    if args.figure:
        learnt = [m for members in groups.values() for m in members if m["task"] != "sorting"]
        plot_against_heads(learnt, ["head_dim"], lambda m: m["reached"], "steps to 99% held-out accuracy", args.figure)
    if args.accuracy_figure:
        every = [m for members in groups.values() for m in members]
        accuracy = lambda m: 100 * m["eval_accuracy"]  # noqa: E731
        plot_against_heads(every, ["head_dim"], accuracy, "held-out accuracy %", args.accuracy_figure)
    return 0


if __name__ == "__main__":
    sys.exit(main())
