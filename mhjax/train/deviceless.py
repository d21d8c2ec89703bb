"""Compile a sweep for a target device that is not in this machine (``--dry-run --target``).

The sweep is planned for the target's backend (``attention=auto`` and ``strategy=auto`` pick
what a GPU would get), its constants and states become shapes on the target's compile-only
mesh (train/target.py), and every executable a run would build (initial state, each chunk
length, evaluation: train/ahead.py's jobs) is compiled by the target's compiler, one after
another, with JAX's persistent cache off, so that each time is a real compile. Nothing runs.

A target of N devices (``h200x8``) plans the sweep for N (``auto`` strategy and the member
layout: the plan, mhjax.plan) and compiles it for N compile-only devices, the member
axis split over them where it divides (train/placement.py).

For each executable: compile seconds, memory per device against the target's, whether its
program is split over the devices or replicated on each, the collectives in it (a training
chunk should have none: members are independent), and the Triton kernels in it with the
members each call computes. For the training chunk: the attention path actually in the program
(kernel calls; (..., T, T) values of any type, i.e. attention maps or masks in memory) and the bytes per
member-step its top-level kernels move (train/hlo.py), beside models/cost.py's estimate.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import re
import threading
import time
from typing import NamedTuple

import jax

from mhjax.models import tpu_vmem
from mhjax.train import ahead, hlo, hlo_flops, snapshots
from mhjax.train import target as targets
from mhjax.train.loop import Sweep
from mhjax.train.placement import Placement


class Executable(NamedTuple):
    key: tuple  # ahead.Job.key
    seconds: float
    arguments: int  # bytes per device
    outputs: int
    temp: int
    alias: int  # outputs that reuse (donated) argument buffers
    kernels: dict  # {Pallas kernel name (Triton or Mosaic): calls}
    square: int  # lines with a (..., T, T) value of any type
    bytes_per_member_step: float | None  # training chunks only, besides the Pallas kernels
    kernel_bytes_per_member_step: float | None  # the Pallas calls': stated (a cost estimate), else whole operands
    collectives: dict = {}  # {kind: instructions}, hlo.collectives
    kernel_members: tuple = ()  # leading dimensions of the Triton calls' results (members per call)
    replicated: bool = False  # every device computes every member (members do not divide the devices)
    cost: dict = {}  # the compiler's cost analysis where it gives one (a TPU's: flops, bytes accessed)
    flops_per_member_step: float | None = None  # a TPU chunk's matmul FLOPs, loops per trip (hlo_flops)

    @property
    def total(self) -> int:
        return self.arguments + self.outputs - self.alias + self.temp


class Report(NamedTuple):
    target: targets.Target
    description: str  # ahead.describe's line
    executables: list[Executable]
    estimate_bytes: float | None  # models/cost.py's bytes per member-step, where the experiment has it
    length: int | None  # model.seq_len, where the experiment has one: the (T, T) maps looked for
    members: dict = {}  # {program: members one device computes}
    estimate_flops: float | None = None  # models/cost.py's matmul FLOPs per member-step, where it has them
    wall: float | None = None  # seconds from the first compile's start to the last one's end
    fitted: bool = False  # the model's byte ratios were fitted on this sweep: its error is not shown


COMPILERS = 2  # programs compiled side by side for a target


def step_bytes(text: str, length: int) -> float:
    """Bytes one step of a ``length``-step chunk moves: loop bodies counted once per trip
    (XLA's known trip counts, nested loops such as the layers' scan included), the entry
    computation once, over ``length`` steps."""
    return hlo.kernel_bytes(text, weighted=True) / length


@contextlib.contextmanager
def persistent_cache_off():
    """No persistent cache: every compile is timed for real. JAX decides whether to use the
    cache once per process, so it is told to decide again on the way in and out."""
    from jax.experimental.compilation_cache import compilation_cache

    saved = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", saved)
        compilation_cache.reset_cache()


def compile_for(experiment, target: targets.Target, log=print, only: tuple[str, ...] = ()) -> Report:
    """Compile every executable of ``experiment``'s run from step 0 for ``target`` (``only``:
    those of these roles, e.g. ("chunk",)); ``log`` gets a line as each one starts (compiles
    of the paper sweep take minutes on 2 cores)."""
    placement = Placement(targets.devices(target), abstract=True)
    # Planned for the target's backend and device count (the abstract placement's: Sweep.plan):
    # attention=auto resolves to what a GPU runs, the Pallas kernel lowered through Triton
    # (interpret=False: models/attention_choice.py), and strategy=auto and one_program's member
    # order to what N of them run.
    sweep = Sweep(experiment, target.backend, placement)
    config = experiment.config
    # The run's plan from step 0, as the host loop makes it (the first chunk cut at early
    # evaluations, any chunk at snapshot steps).
    steps, chunk, snaps = config.train.steps, config.train.chunk_steps, snapshots.steps_of(config)
    plan = ahead.chunk_plan(0, steps, chunk, splits=experiment.eval_steps(), anywhere=snaps)
    lengths, pieces = plan.chunk_lengths, plan.piece_length
    description = ahead.describe(sweep, lengths, True, pieces)
    # The members one device computes: the compiled program is one device's (per member-step figures)
    members = {p.name: len(p.members) for p in sweep.programs}
    here = {name: n // placement.size if placement.sharded(n) else n for name, n in members.items()}
    length = config.model.get("seq_len")

    def build(job) -> Executable:
        name = " ".join(str(k) for k in job.key)
        log(f"compiling {name} for {target.device}")
        try:
            executables, seconds, _ = ahead.compile_all([job])
        except Exception as exc:  # noqa: BLE001 -- once in ~6 paper dry runs: "Failed to launch ptxas"
            if out_of_memory(exc):  # it would fail again, as slowly
                raise CompileFailed(failure_line(name, target, exc)) from None
            log(f"compiling {name} again ({ahead.first_line(exc)})")
            try:
                with alone:
                    executables, seconds, _ = ahead.compile_all([job])
            except Exception as again:  # noqa: BLE001 -- one line, never a traceback
                raise CompileFailed(failure_line(name, target, again)) from None
        described = _describe(job.key, executables[job.key], seconds, here, length, target)
        return described._replace(replicated=placement.size > 1 and not placement.sharded(members[job.key[1]]))

    # COMPILERS programs compile side by side, each read (its HLO text) on its own thread: a
    # target's compiler (XLA:GPU with ptxas, libtpu) leaves this CPU's cores idle between its
    # passes, so two at a time take ~15 % less wall time than one after another
    # (benchmarks/RESULTS.md, "Dry-run cost"); each program's seconds are its own, overlapping.
    # a failed compile is tried once more (a real error fails again and is raised), under a lock
    # so that two retries do not run side by side
    start, alone = time.perf_counter(), threading.Lock()
    # the TPU kernel's scoped VMEM limit for the target's chip, not this machine's (tpu_vmem.limit)
    chip = tpu_vmem.for_chip(target.device) if target.backend == "tpu" else contextlib.nullcontext()
    with persistent_cache_off(), chip, concurrent.futures.ThreadPoolExecutor(COMPILERS, "mhjax-target") as pool:
        chosen = [job for job in ahead.jobs(sweep, lengths, True, pieces) if not only or job.key[0] in only]
        out = [future.result() for future in [pool.submit(build, job) for job in chosen]]
    wall = time.perf_counter() - start
    flops = sweep.plan.estimate("dot_flops_per_member_step")
    estimate = sweep.plan.estimate("compiled_bytes_per_member_step")
    fitted = target.backend == "tpu" and estimate is not None and _fitted(experiment.config)
    return Report(target, description, out, estimate, length, here, flops, wall, fitted)


def _fitted(config) -> bool:
    """Whether models/cost_tpu.py's byte ratios were fitted on a sweep of this one's shape."""
    from mhjax.models import cost, cost_tpu

    return cost_tpu.fitted(cost.Shape.of(config), config.model.get("dtype", "float32"))


class CompileFailed(RuntimeError):
    """A target's compiler refused an executable: one line (the command prints it, exit 1)."""


# what the compiler reports of an allocation that did not fit (Mosaic's scoped VMEM, XLA's HBM)
ALLOCATION = re.compile(r"Scoped allocation with size \S+ and limit \S+|Ran out of memory in memory space \w+")
OUT_OF_MEMORY = ("RESOURCE_EXHAUSTED", "CompileTimeScopedVmemOom", "Ran out of memory")
CUSTOM_CALL = re.compile(r"(mhjax_tpu_attention_(?:fwd|bwd)|flash_\w+)")


def out_of_memory(exc: BaseException) -> bool:
    return any(word in str(exc) for word in OUT_OF_MEMORY)


def failure_line(name: str, target, exc: BaseException) -> str:
    """One line naming the executable, the kernel and the allocation where the message has
    them (the compiler's own message is many lines of HLO), else its first line."""
    text = str(exc)
    found = [m.group(0).rstrip(".") for m in ALLOCATION.finditer(text)]
    kernel = CUSTOM_CALL.search(text)
    if not found:
        return f"compiling {name} for {target.device} failed: {ahead.first_line(exc)}"
    where = f" in {kernel.group(1)}" if kernel else ""
    return f"compiling {name} for {target.device} failed{where}: {'; '.join(dict.fromkeys(found))}"


def _describe(key, executable, seconds: float, members: dict, length, target) -> Executable:
    memory = executable.memory_analysis()
    text = executable.as_text()
    per_step = kernel_step = flops = None
    if key[0] == "chunk":  # train/hlo.py reads a GPU's or a TPU's program
        # one step's, per member: besides the Pallas calls, and the calls (loop bodies per trip)
        per_step, kernel_step = (b / key[2] / members[key[1]] for b in hlo.split_bytes(text, weighted=True))
        if target.backend == "tpu":  # its cost analysis counts each loop body once (hlo_flops.py)
            flops = hlo_flops.matmul_flops(text) / key[2] / members[key[1]]
    return Executable(
        key,
        seconds,
        memory.argument_size_in_bytes,
        memory.output_size_in_bytes,
        memory.temp_size_in_bytes,
        memory.alias_size_in_bytes,
        dict(hlo.triton_kernels(text) + hlo.tpu_kernels(text)),
        hlo.square_tensors(text, length) if length else 0,
        per_step,
        kernel_step,
        dict(hlo.collectives(text)),
        tuple(hlo.kernel_members(text)),
        cost=_cost(executable),
        flops_per_member_step=flops,
    )


def _cost(executable) -> dict:
    """{"flops", "bytes accessed"} of the compiler's cost analysis; {} where it has none (the
    GPU compiler's is None)."""
    try:
        analysis = executable.cost_analysis()
    except Exception:  # noqa: BLE001  (a backend without one)
        return {}
    analysis = analysis[0] if isinstance(analysis, (list, tuple)) and analysis else analysis
    if not isinstance(analysis, dict):
        return {}
    return {k: float(analysis[k]) for k in ("flops", "bytes accessed") if k in analysis}


def _split(e: Executable, devices: int) -> str:
    return "one device" if devices == 1 else "replicated" if e.replicated else f"split /{devices}"


def _collectives(counts: dict) -> str:
    return ", ".join(f"{kind} x{n}" for kind, n in sorted(counts.items()))


def _gib(n: float) -> str:
    return f"{n / 2**30:.2f}"


def _size(n: float) -> str:
    return f"{n / 2**20:,.1f} MiB" if n < 2**30 else f"{n / 2**30:,.2f} GiB"


def lines(report: Report) -> list[str]:
    """The dry run's table and summary for ``report``."""
    t, length = report.target, report.length
    devices = f"{t.count} x {t.device}" if t.count > 1 else t.device
    out = [
        f"target: {devices} ({t.name}), {_gib(t.memory_bytes)} GiB per device, compiled here with "
        f"jax {jax.__version__}'s {t.compiler} compiler; {report.description}",
        f"  {'executable':<18} {'compile':>8} {'arguments':>12} {'outputs':>12} {'temp':>12} "
        f"{'total':>12} {'of device':>9}  {'members':<10} {'collectives':<16} attention",
    ]
    for e in report.executables:
        none = "no Pallas TPU kernel" if t.backend == "tpu" else "no Triton kernel"
        kernels = ", ".join(f"{k} x{n}" for k, n in sorted(e.kernels.items())) or none
        if e.kernel_members:
            kernels += f" of {'/'.join(map(str, e.kernel_members))} members"
        if length and e.key[0] in ("chunk", "piece"):
            kernels += f"; {e.square} (..., {length}, {length}) value(s)" if e.square else "; no (T, T) map"
        out.append(
            f"  {' '.join(str(k) for k in e.key):<18} {e.seconds:>7.1f}s {_size(e.arguments):>12} "
            f"{_size(e.outputs):>12} {_size(e.temp):>12} {_size(e.total):>12} {e.total / t.memory_bytes:>9.1%}  "
            f"{_split(e, t.count):<10} {_collectives(e.collectives) or 'none':<16} {kernels}"
        )
    if t.count > 1:
        out.append(f"  memory is per device; members: split over the {t.count} devices, or replicated on each")
    replicated = sorted({e.key[1] for e in report.executables if e.replicated})
    if replicated:
        out.append(
            f"replicated: program(s) {', '.join(replicated)}: members do not divide the {t.count} devices, "
            "so every device computes all of them"
        )
    for e in report.executables:
        if e.key[0] in ("chunk", "piece") and e.collectives:
            key = " ".join(str(k) for k in e.key)
            out.append(
                f"warning: training {key} holds collectives ({_collectives(e.collectives)}): members are "
                "independent, so a split chunk should need none (each step waits on them)"
            )
    total = sum(e.seconds for e in report.executables)
    fits = max(e.total for e in report.executables) <= t.memory_bytes
    side = (
        f" ({report.wall:.1f} s of wall time, {COMPILERS} at a time)"
        if report.wall and len(report.executables) > 1
        else ""
    )
    out.append(
        f"compile: {total:.1f} s for {len(report.executables)} executables{side}; memory: "
        + ("fits" if fits else "DOES NOT FIT")
        + f" in {_gib(t.memory_bytes)} GiB"
    )
    for e in report.executables:
        key = " ".join(str(k) for k in e.key)
        if e.key[0] == "chunk" and e.cost:  # one device's program; each loop body counted once (hlo_flops.py)
            members = max(report.members.get(e.key[1], 1), 1)
            flops, accessed = (e.cost.get(k, 0.0) / members / 1e9 for k in ("flops", "bytes accessed"))
            out.append(
                f"{t.compiler} compiler's cost analysis ({key}): {flops:.2f} GFLOP and {accessed:.2f} GB accessed "
                f"per member on one device, every loop body counted once (one step of {e.key[2]}, one layer of a "
                "scanned stack): not per member-step"
            )
        if e.flops_per_member_step is not None:
            members = max(report.members.get(e.key[1], 1), 1)
            out.append(
                f"FLOPs per member-step ({key}, one device's program over its {members} member(s), loop bodies "
                f"per trip; matmuls and Pallas calls): {e.flops_per_member_step / 1e9:.2f} GFLOP"
                + _against(report.estimate_flops, e.flops_per_member_step, "GFLOP of matmuls")
            )
        if e.bytes_per_member_step is not None:
            out.append(_bytes_line(e, key, t.backend == "tpu", report.estimate_bytes, report.fitted))
    return out


def _bytes_line(e: Executable, key: str, tpu: bool, estimate: float | None, fitted: bool = False) -> str:
    """A chunk's bytes per member-step. A TPU's Pallas calls state their bytes, so the total is
    a count and models/cost.py's error is printed (not where the model was fitted on this
    sweep: that "error" could not come out otherwise); a GPU's Triton calls are charged every
    member's operands (an upper bound), so the rest is given beside them and the model's total
    without an error."""
    where = "HBM: values kept in VMEM move none" if tpu else "the compiled program's top-level kernels"
    kernels = e.kernel_bytes_per_member_step or 0.0
    if kernels and not tpu:
        model = f"; models/cost.py: {estimate / 1e9:.3f} GB in all" if estimate else ""
        return (
            f"bytes per member-step ({key}, {where}): {e.bytes_per_member_step / 1e9:.3f} GB besides the "
            f"Pallas kernels' calls ({kernels / 1e9:.3f} GB at most: their whole operands){model}"
        )
    moved = e.bytes_per_member_step + kernels
    stated = (
        f", of it the Pallas kernels' calls {kernels / 1e9:.3f} GB (their stated bytes, HBM's share)" if kernels else ""
    )
    line = f"bytes per member-step ({key}, {where}): {moved / 1e9:.3f} GB{stated}"
    if fitted and estimate:
        return line + f"; models/cost.py: {estimate / 1e9:.3f} GB (its byte ratios were fitted on this sweep)"
    return line + _against(estimate, moved, "GB")


def _against(estimate: float | None, counted: float, unit: str) -> str:
    """models/cost.py's figure beside the compiled program's, and its error."""
    if not estimate:
        return ""
    return f"; models/cost.py: {estimate / 1e9:.3f} {unit}, error {estimate / counted - 1:+.1%}"
