"""Successive halving (config.train.halving) against the full grid, in one invocation: a CPU-sized
tuned sweep (copy and cycle, heads 1 and 4, four learning rates, two seeds) trained twice, halved
and not; member-steps and wall time of each, and in how many (group, head count) pairs the halved
run's comparisons selected the same learning rate as the full grid's (short-horizon bias: a rate
that is ahead at a rung is not always the best at the end).

    python benchmarks/halving.py [--steps 120] [--rungs 40,80] [--reduction-factor 2] [--json OUT]

Each run starts with a warm compile cache when run twice; the first invocation compiles both."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import ml_collections

import mhjax

RATES = (1e-3, 3e-3, 1e-2, 3e-2)


def config(steps: int, rungs: tuple[int, ...] | None, factor: float):
    c = ml_collections.ConfigDict()
    c.experiment, c.seed, c.strategy, c.attention = "sequence", 0, "grouped", "auto"
    c.sweep = ml_collections.ConfigDict(dict(task=("copy", "cycle"), heads=(1, 4), seed=(0, 1), learning_rate=RATES))
    c.model = ml_collections.ConfigDict(
        dict(width=32, num_layers=1, mlp_dim=64, vocab_size=16, seq_len=16, dropout=0.0)
    )
    c.data = ml_collections.ConfigDict(dict(protocol="fresh", num_train=64, batch_size=16, num_eval=64))
    c.train = ml_collections.ConfigDict(dict(steps=steps, chunk_steps=20, eval_every=40, checkpoint_every=steps))
    c.compare = ml_collections.ConfigDict({"tune": ("learning_rate",)})
    if rungs:
        c.train.halving = dict(rungs=rungs, reduction_factor=factor)
    return c


def train(c, workdir: str) -> tuple[dict, float]:
    start = time.perf_counter()
    mhjax.sweep(c, workdir, progress=False)
    wall = time.perf_counter() - start
    with open(os.path.join(workdir, "results.json")) as f:
        return json.load(f), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--rungs", default="40,80")
    parser.add_argument("--reduction-factor", type=float, default=2.0)
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args()
    rungs = tuple(int(r) for r in args.rungs.split(","))
    with tempfile.TemporaryDirectory() as root:
        full, full_wall = train(config(args.steps, None, args.reduction_factor), os.path.join(root, "full"))
        halved, halved_wall = train(config(args.steps, rungs, args.reduction_factor), os.path.join(root, "halved"))
    pick = lambda r: {(json.dumps(e["group"]), e["heads"]): e["selected"] for e in r["comparisons"]}  # noqa: E731
    chosen_full, chosen_halved = pick(full), pick(halved)
    same = sum(chosen_full[k] == chosen_halved.get(k) for k in chosen_full)
    out = {
        "steps": args.steps,
        "rungs": list(rungs),
        "keep": halved["halving"]["keep"],
        "members": len(full["members"]),
        "member_steps": {"halved": halved["halving"]["member_steps"], "full": args.steps * len(full["members"])},
        "wall_s": {"halved": round(halved_wall, 1), "full": round(full_wall, 1)},
        "groups": len(chosen_full),
        "same_selection": same,
        "selected": {
            f"{k[0]} heads {k[1]}": {"full": chosen_full[k], "halved": chosen_halved.get(k)} for k in chosen_full
        },
    }
    print(json.dumps(out, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
