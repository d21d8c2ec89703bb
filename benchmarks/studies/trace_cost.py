"""What the mixture's per-step trace (MixtureRecipe.trace, W/trace) costs: member-steps/s of the
training chunk with ``train.trace`` on and off, the same members and chunk length, nothing else
timed (no logging, evaluation or checkpoints). Repeats alternate between the two programs and the
best of each is kept, so a machine shared with other jobs slows both alike; the process's CPU time
(every XLA thread) is printed beside the wall time, as it moves less with other jobs' load.

    python benchmarks/studies/trace_cost.py --config configs/mixture.py [--chunks 5] [--repeat 3]
        [--set FIELD=VALUE ...]
"""

from __future__ import annotations

import argparse
import time

import jax

from mhjax.experiments import make_experiment
from mhjax.train.loop import Sweep
from mhjax.workflows.configs import load_config


def timer(config, chunks: int):
    """A function timing ``chunks`` chunks of ``config``'s one program (compiled first): seconds."""
    sweep = Sweep(make_experiment(config))
    [program] = sweep.programs
    length = int(config.train.chunk_steps)
    states = sweep.init_states()
    states[program.name], _ = sweep.run_chunk(program, states[program.name], length)  # compile
    jax.block_until_ready(states)

    def run() -> tuple[float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(chunks):
            states[program.name], metrics = sweep.run_chunk(program, states[program.name], length)
        jax.block_until_ready((states, metrics))
        return time.perf_counter() - wall, time.process_time() - cpu

    return run, len(program.members) * length * chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/mixture.py")
    parser.add_argument("--chunks", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--set", nargs="*", default=[], help="FIELD=VALUE overrides")
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.set)
    timers = {
        on: timer(load_config(args.config, {**overrides, "train.trace": on}), args.chunks) for on in (False, True)
    }
    best = {on: [float("inf")] * 2 for on in timers}
    for _ in range(args.repeat):
        for on, (run, _) in timers.items():
            best[on] = [min(b, t) for b, t in zip(best[on], run())]
    for on, (_, member_steps) in timers.items():
        wall, cpu = best[on]
        print(
            f"trace {'on ' if on else 'off'}: {member_steps / wall:,.1f} member-steps/s wall, "
            f"{member_steps / cpu:,.1f} per CPU second (best of {args.repeat})"
        )
    for i, what in enumerate(("wall", "CPU")):
        print(f"cost of the trace: {100 * (best[True][i] / best[False][i] - 1):+.1f}% {what} time per chunk")


if __name__ == "__main__":
    main()
