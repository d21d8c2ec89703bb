"""Paired differences of the test loss between head counts, with and without init.nested_heads.

A mixture config is trained twice in memory (train/loop.Sweep, no workdir): once as it is and once
with ``init.nested_heads = True`` (head h's draw from (seed, h) only, so every H of a seed starts
from the first H heads of the same draw). For each n and each pair of neighbouring head counts
(H, H'), the difference test_loss(H') - test_loss(H) is taken within each seed (same data, and
with nesting the same first H heads), and its mean and standard deviation over the seeds are
printed: nesting is worth having where it narrows that spread.

    python benchmarks/studies/nested_heads.py --config configs/mixture.py --seeds 8 [--set train.steps=150 ...]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from mhjax.experiments import make_experiment
from mhjax.train.loop import Sweep
from mhjax.workflows.configs import load_config


def test_losses(config) -> dict:
    """{(n, H, seed): test loss at theta_K} of every member of ``config``."""
    experiment = make_experiment(config)
    sweep = Sweep(experiment)
    states = sweep.train(sweep.init_states(), int(config.train.steps), int(config.train.chunk_steps))
    evaluation = sweep.evaluate(states)
    return {
        (m["num_train"], m["heads"], m["seed"]): evaluation[i]["test_loss"] for i, m in enumerate(experiment.members)
    }


def paired(losses: dict) -> dict:
    """{(n, H, H'): (mean, std over seeds) of test_loss(H') - test_loss(H)} for neighbouring H < H'."""
    ns = sorted({k[0] for k in losses})
    heads = sorted({k[1] for k in losses})
    seeds = sorted({k[2] for k in losses})
    out = {}
    for n in ns:
        for a, b in zip(heads, heads[1:]):
            d = np.array([losses[(n, b, s)] - losses[(n, a, s)] for s in seeds])
            out[(n, a, b)] = (float(d.mean()), float(d.std(ddof=1)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/mixture.py")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--set", nargs="*", default=[], help="FIELD=VALUE overrides, e.g. train.steps=150")
    args = parser.parse_args()
    results = {}
    for nested in (False, True):
        overrides = dict(item.split("=", 1) for item in args.set)
        overrides.update({"sweep.seed": tuple(range(args.seeds)), "init.nested_heads": nested})
        config = load_config(args.config, overrides)
        start = time.perf_counter()
        results[nested] = paired(test_losses(config))
        print(f"nested_heads={nested}: {time.perf_counter() - start:.0f} s", flush=True)
    print(
        "| n | H -> H' | mean diff (independent) | std over seeds (independent) | mean diff (nested) | std (nested) |"
    )
    print("|---|---|---|---|---|---|")
    for key in results[False]:
        (m0, s0), (m1, s1) = results[False][key], results[True][key]
        print(f"| {key[0]} | {key[1]} -> {key[2]} | {m0:+.4f} | {s0:.4f} | {m1:+.4f} | {s1:.4f} |")


if __name__ == "__main__":
    main()
