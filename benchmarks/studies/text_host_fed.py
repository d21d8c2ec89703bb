"""ms per training step of the text task with the corpus on the device, fed from the host once per
chunk (a file above data/text.ON_DEVICE_LIMIT, forced here by patching the limit), and fed from
the host once per step (the recipe's prefetch turned off, as before issue 40's per-chunk read),
on this CPU (docs/text.md). configs/text.py with docs/text.md's CPU overrides (width 64, 2 layers,
T = 64, heads 1, 4, 16); each run compiled and warmed by one chunk of ``--steps``, then the best
of ``--repeats`` timed chunks, the three interleaved. Also checks that the three give equal losses.

    python examples/python_docs.py docs.txt --kib 400
    python benchmarks/studies/text_host_fed.py docs.txt [--steps 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from mhjax.data import text  # noqa: E402
from mhjax.experiments import make_experiment  # noqa: E402
from mhjax.experiments.sequence_recipe import SequenceRecipe  # noqa: E402
from mhjax.train.loop import Sweep  # noqa: E402
from mhjax.workflows.configs import load_config  # noqa: E402

CPU = {"model.width": 64, "model.num_layers": 2, "model.mlp_dim": 256, "model.seq_len": 64}


def sweep_of(path: str, steps: int) -> Sweep:
    overrides = {**CPU, "data.path": path, "train.chunk_steps": steps, "train.warmup_steps": 10}
    config = load_config("configs/text.py", {**overrides, "sweep.heads": (1, 4, 16)})
    return Sweep(make_experiment(config), "cpu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", help="a byte file (examples/python_docs.py)")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs = {"on the device": sweep_of(args.path, args.steps)}
    text.ON_DEVICE_LIMIT = 1000  # every file read by the host from here on
    text._LOADED.clear(), text._BOUND.clear()
    runs["host, once per chunk"] = sweep_of(args.path, args.steps)
    states, losses = {}, {}

    def warm(name):  # compiles the chunk's program (traced on its first call)
        sweep = runs[name]
        states[name] = jax.block_until_ready(sweep.train(sweep.init_states(), args.steps, args.steps))

    warm("on the device"), warm("host, once per chunk")
    prefetch = SequenceRecipe.prefetch
    SequenceRecipe.prefetch = lambda self, *a: None  # the step draws its own batch: a read per step
    runs["host, once per step"] = sweep_of(args.path, args.steps)
    warm("host, once per step")
    SequenceRecipe.prefetch = prefetch
    best = {}
    for _ in range(args.repeats):
        for name, sweep in runs.items():
            start = time.perf_counter()
            states[name] = jax.block_until_ready(sweep.train(states[name], args.steps, args.steps))
            best[name] = min(best.get(name, float("inf")), (time.perf_counter() - start) / args.steps)
            losses[name] = np.concatenate([np.asarray(s.last_loss) for s in states[name].values()])
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.steps}-step chunks")
    for name, seconds in best.items():
        same = np.array_equal(losses[name], losses["on the device"])
        print(f"{name:22s} {1000 * seconds:7.1f} ms/step (3 members); losses equal to the device's: {same}")


if __name__ == "__main__":
    main()
