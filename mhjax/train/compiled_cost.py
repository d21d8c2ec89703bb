"""XLA's own account of a sweep's training chunk, compiled on this machine for ``mhjax train
--dry-run`` (an experiment without a cost model of its own: the mixture).

Each program's chunk (the run's first chunk length) is lowered and compiled as the host loop
would compile it (train/ahead.py's jobs), and its compiled ``cost_analysis()`` (FLOPs, bytes
accessed) and ``memory_analysis()`` (argument, output, temporary and aliased bytes) are printed.
Nothing runs and nothing is estimated: no rate, no time. XLA's cost analysis counts a loop body
once, not once per trip, so its counts are those of ONE step of the chunk's scan over all of
the program's members (plus what the chunk does once); a count per member-step divides by the
members.
"""

from __future__ import annotations

from typing import NamedTuple

from mhjax.train import ahead
from mhjax.train.loop import Sweep


class ChunkCost(NamedTuple):
    program: str
    members: int
    steps: int  # the chunk's length
    flops: float | None  # one step, all members (XLA's cost analysis; None: the backend gives none)
    bytes_accessed: float | None
    arguments: int  # bytes
    outputs: int
    temp: int
    alias: int  # outputs in donated argument buffers


def chunk_costs(experiment, backend: str) -> list[ChunkCost]:
    """Compile each program's training chunk of the run's first chunk length on ``backend``."""
    sweep = Sweep(experiment, backend)
    config = experiment.config
    length = ahead.chunk_lengths(0, int(config.train.steps), int(config.train.chunk_steps))[0]
    sizes = {p.name: len(p.members) for p in sweep.programs}
    out = []
    for job in ahead.jobs(sweep, [length], init=False):
        if job.key[0] != "chunk":
            continue
        compiled = job.jitted.lower(*job.args).compile()
        cost = compiled.cost_analysis()
        cost = (cost[0] if cost else None) if isinstance(cost, (list, tuple)) else cost
        memory = compiled.memory_analysis()
        out.append(
            ChunkCost(
                job.key[1],
                sizes[job.key[1]],
                length,
                _number(cost, "flops"),
                _number(cost, "bytes accessed"),
                memory.argument_size_in_bytes,
                memory.output_size_in_bytes,
                memory.temp_size_in_bytes,
                memory.alias_size_in_bytes,
            )
        )
    return out


def _number(cost, key: str) -> float | None:
    value = cost.get(key) if isinstance(cost, dict) else None
    return float(value) if value is not None and value >= 0 else None


def lines(costs: list[ChunkCost], backend: str) -> list[str]:
    """The dry run's lines: per program, XLA's FLOPs and bytes of one step and the chunk's memory."""
    out = [f"compiled here on {backend} (XLA's cost and memory analysis of each program's training chunk):"]
    for c in costs:
        if c.flops is None:
            work = "no cost analysis on this backend"
        else:
            per_member = c.flops / max(c.members, 1)
            work = f"{c.flops:.4g} FLOPs per step ({per_member:.4g} per member-step)"
            if c.bytes_accessed is not None:
                work += f", {c.bytes_accessed / 2**20:.2f} MiB accessed per step"
        total = c.arguments + c.outputs - c.alias + c.temp
        out.append(
            f"  program {c.program} ({c.members} members, chunk of {c.steps} steps): {work}; memory "
            f"{_mib(total)} (arguments {_mib(c.arguments)}, outputs {_mib(c.outputs)} of which "
            f"{_mib(c.alias)} in donated buffers, temporaries {_mib(c.temp)})"
        )
    return out


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"
