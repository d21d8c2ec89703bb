"""ms per training step in float32 and bfloat16 (config.model.dtype), on the JAX attention path
and the C++ kernel, on this CPU (docs/bfloat16.md). The quick config's model, copy at heads 1
and 4, strategy grouped; each run compiled and warmed by one chunk of ``--steps``, then the best
of ``--repeats`` timed chunks, the four interleaved.

    python benchmarks/studies/bfloat16_cpu.py [--config configs/quick.py] [--steps 20] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mhjax.config import apply_overrides  # noqa: E402
from mhjax.experiments import make_experiment, override_defaults  # noqa: E402
from mhjax.train.loop import Sweep  # noqa: E402
from mhjax.workflows.configs import load_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/quick.py")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = {}
    for dtype in ("float32", "bfloat16"):
        for attention in ("jax", "cpu_kernel"):
            config = load_config(args.config)
            overrides = {"model.dtype": dtype, "attention": attention, "strategy": "grouped"}
            config = apply_overrides(config, overrides, override_defaults(config))
            config.sweep.task, config.sweep.heads, config.sweep.seed = ("copy",), (1, 4), (0,)
            sweep = Sweep(make_experiment(config), "cpu")
            states = jax.block_until_ready(sweep.train(sweep.init_states(), args.steps, args.steps))
            runs[dtype, attention] = (sweep, states)
    best = {}
    for _ in range(args.repeats):
        for key, (sweep, states) in runs.items():
            start = time.perf_counter()
            jax.block_until_ready(sweep.train(states, args.steps, args.steps))
            best[key] = min(best.get(key, float("inf")), (time.perf_counter() - start) / args.steps)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for (dtype, attention), seconds in best.items():
        print(f"{dtype:9s} {attention:11s} {1000 * seconds:7.1f} ms/step (2 members)")


if __name__ == "__main__":
    main()
