"""Compile time of a sweep's executables as `mhjax train` builds them (mhjax/train/ahead.py):
the initial state, one training chunk and the evaluation on ``--workers`` threads (what a run
waits for; a run uses one), then each again alone (lowering and compiling). The persistent
cache is off.

    python benchmarks/compile_time.py [--config configs/paper.py] [--attention auto|jax|cpu_kernel|pallas]
        [--seeds 0,1,2,3,4,5,6,7] [--strategy one_program] [--workers 1] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import jax

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mhjax.experiments import make_experiment  # noqa: E402
from mhjax.models.attention_choice import IMPLEMENTATIONS  # noqa: E402
from mhjax.train import ahead  # noqa: E402
from mhjax.train.loop import Sweep  # noqa: E402
from mhjax.workflows.configs import load_config  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/paper.py")
    parser.add_argument("--seeds", default="0,1,2,3,4,5,6,7")
    parser.add_argument("--strategy", default="one_program")
    parser.add_argument("--attention", default="auto", choices=IMPLEMENTATIONS, help="config.attention")
    parser.add_argument("--workers", type=int, default=1, help="compile threads of the first measurement")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    jax.config.update("jax_enable_compilation_cache", False)
    seeds = tuple(int(s) for s in args.seeds.split(","))
    config = load_config(
        args.config, {"sweep.seed": seeds, "strategy": args.strategy, "attention": args.attention}, validate=False
    )
    sweep = Sweep(make_experiment(config))
    lengths = [int(config.train.chunk_steps)]
    out = {
        "attention": args.attention,
        "attention_used": sweep.plan.core,
        "strategy": args.strategy,
        "members": len(sweep.experiment.members),
        "date": time.strftime("%Y-%m-%d"),
        "load_average": os.getloadavg()[0],
        "workers": args.workers,
    }
    _, out["run_compile_s"], _ = ahead.compile_all(ahead.jobs(sweep, lengths, init=True), workers=args.workers)
    for job in ahead.jobs(sweep, lengths, init=True):
        jax.clear_caches()  # the run above left this executable in JAX's in-memory caches
        start = time.perf_counter()
        lowered = job.jitted.lower(*job.args)
        out[f"{job.key[0]}_lower_s"] = time.perf_counter() - start
        start = time.perf_counter()
        lowered.compile()
        out[f"{job.key[0]}_compile_s"] = time.perf_counter() - start
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
