"""Compile every program of a sweep before the training loop, off the main thread.

Each program needs up to three executables: the initial state (not when resuming), one
training chunk per chunk length the run will use (the full chunk and the last, shorter
one), and the evaluation. All are lowered and compiled ahead of time
(``jax.jit(...).lower(...).compile()``) on a worker thread, so the main thread stays free:
it says what is being compiled and for how long, and it takes Ctrl-C (train/interrupt.py)
while XLA works. JAX's persistent cache (io/compile_cache.py) answers a repeated or
resumed sweep's requests from disk; the report says how many it answered.
"""

from __future__ import annotations

import concurrent.futures
import time
from typing import Any, NamedTuple

import jax
import numpy as np
from jax._src import config as jax_config

from mhjax.io.compile_cache import CacheCounter


class Job(NamedTuple):
    """One executable to build: ``jitted.lower(*args).compile()``, stored under ``key``."""

    key: tuple  # ("init", program) | ("chunk", program, length) | ("evaluate", program)
    jitted: Any
    args: tuple


class Compiled(NamedTuple):
    """What a compile-ahead built, for the console: executables, time, cache hits."""

    executables: dict  # Job.key -> jax.stages.Compiled
    seconds: float
    from_cache: int  # executables JAX's persistent cache answered


class ChunkPlan(NamedTuple):
    """The chunks a run trains, in order: ``segments``, (steps, is a piece) each. Pieces (chunks
    cut at early evaluations, at snapshot steps, or a resumed run's partial first chunk) are all
    run by ONE program of up to ``piece_length`` steps (engine.make_partial_chunk); the other
    segments are whole chunks of ``chunk`` steps (the last one may be shorter)."""

    segments: list[tuple[int, bool]]

    def lengths(self) -> list[tuple[int, bool]]:
        """(steps, is a piece) of every chunk, in order."""
        return list(self.segments)

    @property
    def pieces(self) -> list[int]:
        return [n for n, piece in self.segments if piece]

    @property
    def chunks(self) -> list[int]:
        return [n for n, piece in self.segments if not piece]

    @property
    def piece_length(self) -> int:
        """The static length of the pieces' program (0: no pieces)."""
        return max(self.pieces, default=0)

    @property
    def chunk_lengths(self) -> list[int]:
        return sorted(set(self.chunks), reverse=True)


def chunk_plan(step: int, total: int, chunk: int, splits=(), anywhere=()) -> ChunkPlan:
    """The chunks of a run from ``step`` to ``total``. Chunks end at multiples of ``chunk`` (and at
    ``total``) whatever ``step``; a chunk is cut into pieces at every step of ``anywhere`` inside it
    (snapshot steps), and the first chunk of the run, [0, chunk), also at those of ``splits``
    (early evaluations), so that a snapshot or an evaluation falls exactly there. A run resumed
    between two chunk ends (after a piece, or trained longer from a ``total`` that is not a
    multiple) first runs the rest of that chunk as a piece, so later evaluations and snapshots fall
    where they would have in the straight run."""
    anywhere, early = {int(k) for k in anywhere}, {int(k) for k in splits if int(k) < chunk}
    segments, start = [], step
    while start < total:
        end = min((start // chunk + 1) * chunk, total)
        cuts = sorted(k for k in anywhere | early if start < k < end)
        if not cuts and start % chunk and end < total:
            cuts = [end]  # a partial chunk as one piece (no chunk length of its own)
        if cuts:
            bounds = [start, *cuts, *([end] if cuts[-1] != end else [])]
            segments += [(b - a, True) for a, b in zip(bounds, bounds[1:])]
        else:
            segments.append((end - start, False))
        start = end
    return ChunkPlan(segments)


def chunk_lengths(step: int, total: int, chunk: int) -> list[int]:
    """The chunk lengths a run from ``step`` to ``total`` uses without cuts, largest first."""
    return chunk_plan(step, total, chunk).chunk_lengths


def jobs(sweep, lengths: list[int], init: bool, piece_length: int = 0) -> list[Job]:
    """Every executable the host loop will call, with the argument shapes and shardings it
    will call them with (states as abstract values: they do not exist yet); ``piece_length``:
    the program of the chunks' pieces (ChunkPlan)."""
    out = []
    states = sweep.abstract_states(sharded=True)
    for p in sweep.programs:
        consts = sweep.consts[p.name]
        if init:
            out.append(Job(("init", p.name), sweep.init_fn(p), (consts,)))
        for length in lengths:
            out.append(Job(("chunk", p.name, length), sweep.chunk_fn(p, length), (states[p.name], consts)))
        if piece_length:
            count = jax.ShapeDtypeStruct((), jax.numpy.int32)
            args = (states[p.name], consts, count)
            out.append(Job(("piece", p.name, piece_length), sweep.piece_fn(p, piece_length), args))
        out.append(Job(("evaluate", p.name), sweep.evaluate_fn(p), (states[p.name], consts)))
    return out


def describe(sweep, lengths: list[int], init: bool, piece_length: int = 0) -> str:
    """The console's line before a compile, e.g. "1 program (8 members): training chunks of
    50 steps, evaluation, initial state"."""
    programs, members = len(sweep.programs), sum(len(p.members) for p in sweep.programs)
    parts = []
    if lengths:
        parts.append("training chunks of " + " and ".join(str(n) for n in lengths) + " steps")
    if piece_length:
        parts.append(f"chunk pieces at evaluations and snapshots (one program of up to {piece_length} steps)")
    parts.append("evaluation")
    if init:
        parts.append("initial state")
    return f"{programs} program{'s' * (programs != 1)} ({members} member{'s' * (members != 1)}): {', '.join(parts)}"


def _build(job: Job):
    # Threefry (parameter initialisers, key derivations) as one GPU kernel instead of its ~20
    # unrolled rounds per draw: the same bits, and the paper sweep's initial state compiled
    # for an H200 in 6 s instead of 39 s (benchmarks/RESULTS.md). Other backends ignore it.
    with jax_config.threefry_gpu_kernel_lowering(True):
        return job.jitted.lower(*job.args).compile()


def compile_all(job_list: list[Job], workers: int = 1, poll_seconds: float = 0.1) -> tuple[dict, float, int]:
    """({key: executable}, seconds, executables from the persistent cache). Worker threads
    compile; the calling thread only waits, in short slices, so Python runs its signal
    handlers meanwhile. One worker by default: on 2 CPU cores two compiles side by side took
    15-30 % longer than one after another (XLA:CPU already compiles on several threads;
    benchmarks/RESULTS.md)."""
    counter = CacheCounter().start()
    start = time.perf_counter()
    pool = concurrent.futures.ThreadPoolExecutor(max(1, min(workers, len(job_list))), "mhjax-compile")
    try:
        futures = {job.key: pool.submit(_build, job) for job in job_list}
        pending = set(futures.values())
        while pending:
            _, pending = concurrent.futures.wait(pending, timeout=poll_seconds)
        executables = {key: future.result() for key, future in futures.items()}  # re-raises a failed compile
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    return executables, time.perf_counter() - start, min(counter.hits, len(job_list))


def compile_sweep(sweep, lengths: list[int], init: bool, piece_length: int = 0, log=None) -> Compiled:
    """Compile the sweep's executables and hand them to ``sweep`` (Sweep.use).

    A compile that fails where the plan chose a kernel itself (attention=auto picking the
    Pallas kernel on a GPU) is not the end of the run: the plan falls back to its path
    without the kernel (mhjax.plan's Plan.without_kernel, recorded in results.json), ``log`` gets
    one line saying so, and everything is compiled again. Every process of a distributed run
    makes the same decision (a failure on any process counts for all)."""
    failure, start = None, time.perf_counter()
    try:
        executables, _, hits = compile_all(jobs(sweep, lengths, init, piece_length))
    except Exception as exc:  # noqa: BLE001 -- any compile error; re-raised unless the experiment falls back
        failure = exc
    if _failed_anywhere(failure is not None):
        reason = first_line(failure) if failure is not None else "it failed to compile on another process"
        fallen = sweep.plan.without_kernel(reason)
        if fallen is None:
            if failure is not None:
                raise failure
            raise RuntimeError("compile-ahead: an executable failed to compile on another process")
        if log is not None:
            log(f"attention: the Pallas kernel failed to compile ({reason}); attention=auto falls back to JAX")
        sweep.rebuild(fallen)
        executables, _, hits = compile_all(jobs(sweep, lengths, init, piece_length))
    sweep.use(executables)
    return Compiled(executables, time.perf_counter() - start, hits)


def _failed_anywhere(failed: bool) -> bool:
    if jax.process_count() == 1:
        return failed
    from jax.experimental import multihost_utils

    return bool(np.any(multihost_utils.process_allgather(np.array([failed], np.int32))))


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {line[:200]}" if line else type(exc).__name__


def abstract(tree, sharding) -> Any:
    """Shapes and dtypes of ``tree`` as placed with ``sharding`` (what lowering needs)."""
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), tree)


def compile_run(sweep, console, plan, init: bool) -> None:
    """Every executable of the run (train/loop.py), compiled before its loop (or again over a
    halving rung's survivors), said on the console."""
    console.compiling(describe(sweep, plan.chunk_lengths, init, plan.piece_length))
    report = compile_sweep(sweep, plan.chunk_lengths, init, plan.piece_length, log=console.log)
    console.compiled(report.seconds, len(report.executables), report.from_cache)
