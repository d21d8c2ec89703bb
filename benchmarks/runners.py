"""The runners of benchmarks/throughput.py: mhjax's programs, each member alone, PyTorch, and the
machine's fp32 matmul peak. Each runner: warm() compiles and runs once; run(steps) -> {head
count: seconds}; memory(steps) -> bytes."""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from mhjax.experiments.sequence import SequenceExperiment, SequenceRecipe  # noqa: E402
from mhjax.models.flops import train_step_flops  # noqa: E402
from mhjax.train import engine  # noqa: E402
from mhjax.train.loop import Sweep  # noqa: E402

HEADS = (1, 4, 8, 16)


def paper_config():
    spec = importlib.util.spec_from_file_location("mhjax_paper_config", ROOT / "configs" / "paper.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def make_config(heads, length=100, seeds=(0,), strategy="grouped"):
    config = paper_config()
    config.sweep.task = ("copy",)
    config.sweep.heads = tuple(heads)
    config.sweep.seed = tuple(seeds)
    config.model.seq_len = length
    config.strategy = strategy
    return config


def model_flops(config) -> float:
    m, d = config.model, config.data
    return train_step_flops(d.batch_size, m.seq_len, m.width, m.num_layers, m.mlp_dim, m.vocab_size)


# ---------------------------------------------------------------- memory


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        return 0


class RSSSampler:
    """Peak rise of the process's resident memory while the block runs (sampled every ms)."""

    def __enter__(self):
        self.base = self.peak = _rss_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss_bytes())
            time.sleep(0.001)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_bytes())
        self.rise = self.peak - self.base


def xla_peak_bytes(jitted, *args) -> float | None:
    """Arguments + outputs + temporaries of the compiled program (donated outputs alias)."""
    try:
        stats = jitted.lower(*args).compile().memory_analysis()
        return float(
            stats.argument_size_in_bytes
            + stats.output_size_in_bytes
            - stats.alias_size_in_bytes
            + stats.temp_size_in_bytes
        )
    except Exception:  # noqa: BLE001 - memory analysis is best effort
        return None


# ---------------------------------------------------------------- runners
# Each runner: warm() compiles and runs once; run(steps) -> {head count: seconds} for
# `steps` steps of all its members (blocking until done).


class SweepRunner:
    """mhjax's own engine: Sweep.run_chunk over each program (a scanned, vmapped chunk)."""

    def __init__(self, config, label):
        self.label = label
        self.config = config
        self.sweep = Sweep(SequenceExperiment(config), "cpu" if jax.default_backend() == "cpu" else None)
        self.states = self.sweep.init_states()
        members = self.sweep.experiment.members
        self.members = len(members)
        self.program_heads = {p.name: sorted({members[i]["heads"] for i in p.members}) for p in self.sweep.programs}

    def run(self, steps):
        out = {}
        for program in self.sweep.programs:
            name = program.name
            start = time.perf_counter()
            self.states[name], metrics = self.sweep.run_chunk(program, self.states[name], steps)
            jax.block_until_ready((self.states[name], metrics))
            heads = self.program_heads[name]
            out[heads[0] if len(heads) == 1 else "all"] = time.perf_counter() - start
        self.last_loss = float(np.nanmean(np.asarray(jax.device_get(metrics["loss"]))))
        return out

    def warm(self, steps):
        self.run(steps)

    def memory(self, steps):
        total = 0.0
        for name in (p.name for p in self.sweep.programs):
            fn = self.sweep._chunks.get((name, steps))
            size = None if fn is None else xla_peak_bytes(fn, self.states[name], self.sweep.consts[name])
            if size is None:
                return None
            total = max(total, size)  # programs run one after another
        return total


class ProgramView:
    """One program of a SweepRunner, timed on its own (reuses its compiled chunk)."""

    def __init__(self, parent: SweepRunner, program: str, label: str):
        self.parent, self.label, self.config = parent, label, parent.config
        self.program = next(p for p in parent.sweep.programs if p.name == program)
        self.members = len(self.program.members)

    def run(self, steps):
        name = self.program.name
        sweep, states = self.parent.sweep, self.parent.states
        start = time.perf_counter()
        states[name], metrics = sweep.run_chunk(self.program, states[name], steps)
        jax.block_until_ready((states[name], metrics))
        return {"all": time.perf_counter() - start}

    def warm(self, steps):
        self.run(steps)

    def memory(self, steps):
        name = self.program.name
        fn = self.parent.sweep._chunks.get((name, steps))
        return None if fn is None else xla_peak_bytes(fn, self.parent.states[name], self.parent.sweep.consts[name])


class SequentialRunner:
    """Each member alone: engine.train_step jitted per head count, one call per step."""

    def __init__(self, config, label="sequential"):
        self.label = label
        experiment = SequenceExperiment(config)
        attention = experiment.plan(jax.default_backend()).attention
        self.items = []
        for member in experiment.members:
            recipe = SequenceRecipe(config, member["heads"], static_heads=True, attention=attention)
            consts = jax.tree_util.tree_map(jnp.asarray, experiment.member_constants(member))
            state = jax.jit(lambda c, recipe=recipe: engine.init_member(recipe, c))(consts)
            step = jax.jit(lambda s, c, recipe=recipe: engine.train_step(recipe, s, c), donate_argnums=0)
            self.items.append([member["heads"], step, consts, state])
        self.members = len(self.items)

    def run(self, steps):
        out = {}
        for item in self.items:
            heads, step, consts, state = item
            start = time.perf_counter()
            for _ in range(steps):
                state, metrics = step(state, consts)
            jax.block_until_ready((state, metrics))
            out[heads] = out.get(heads, 0.0) + time.perf_counter() - start
            item[3] = state
        self.last_loss = float(metrics["loss"])
        return out

    def warm(self, steps):
        self.run(steps)

    def memory(self, steps):
        sizes = [xla_peak_bytes(step, state, consts) for _, step, consts, state in self.items]
        return None if None in sizes else max(sizes)


def torch_device() -> str:
    """Where the PyTorch peers run: CUDA when PyTorch sees a GPU, else the CPU."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_model_args(config) -> dict:
    m, d = config.model, config.data
    return dict(
        vocab_size=m.vocab_size,
        length=m.seq_len,
        width=m.width,
        num_layers=m.num_layers,
        mlp_dim=m.mlp_dim,
        dropout=m.dropout,
        batch_size=d.batch_size,
        learning_rate=1e-3,
    )


class TorchRunner:
    """PyTorch, one model at a time (benchmarks/torch_model.Trainer): one member per head count,
    trained one after another, as the paper's reference code trains."""

    def __init__(self, config, threads, label="torch", device="cpu"):
        from torch_model import Trainer

        self.label, self.threads, self.device = label, threads, device
        args = _torch_model_args(config)
        self.trainers = [(h, Trainer(h, device=device, **args)) for h in config.sweep.heads]
        self.members = len(self.trainers)
        self.rss_rise = 0

    def run(self, steps):
        import torch

        if self.threads:
            torch.set_num_threads(self.threads)
        out = {}
        for h, trainer in self.trainers:
            start = time.perf_counter()
            with RSSSampler() as rss:
                self.last_loss = trainer.run(steps)  # ends in float(loss): waits for the device
            out[h] = out.get(h, 0.0) + time.perf_counter() - start
            self.rss_rise = max(self.rss_rise, rss.rise)
        return out

    def warm(self, steps):
        self.run(steps)

    def memory(self, steps):
        return _torch_memory(self.device, self.rss_rise)


class TorchEnsembleRunner(TorchRunner):
    """PyTorch's strongest plain way (benchmarks/torch_model.EnsembleTrainer): per head count,
    all its members (the config's seeds) in one vmapped functional model with one Adam over the
    stacked parameters; head counts one after another."""

    def __init__(self, config, threads, label="torch_ensemble", device="cpu"):
        from torch_model import EnsembleTrainer

        self.label, self.threads, self.device = label, threads, device
        args = _torch_model_args(config)
        seeds = tuple(config.sweep.seed)
        self.trainers = [(h, EnsembleTrainer(h, seeds, device=device, **args)) for h in config.sweep.heads]
        self.members = len(self.trainers) * len(seeds)
        self.rss_rise = 0


def _torch_memory(device, rss_rise) -> float:
    if device == "cuda":
        import torch

        return float(torch.cuda.max_memory_allocated())
    return float(rss_rise)


class MatmulPeak:
    """fp32 matmul FLOP/s: jitted jnp.dot and torch.mm of 2048 x 2048 (inputs as arguments)."""

    N = 2048

    def __init__(self, use_torch=True, device="cpu"):
        key = jax.random.PRNGKey(0)
        self.device = device
        self.a = jax.random.normal(key, (self.N, self.N), jnp.float32)
        self.b = jax.random.normal(jax.random.fold_in(key, 1), (self.N, self.N), jnp.float32)
        self.dot = jax.jit(jnp.dot)
        self.torch = None
        if use_torch:
            import torch

            self.torch = tuple(torch.from_numpy(np.array(x)).to(device) for x in (self.a, self.b))
        self.times = {"jax": [], "torch": []}

    def warm(self, _steps=None):
        self.dot(self.a, self.b).block_until_ready()
        if self.torch is not None:
            self._torch_mm()

    def _torch_mm(self):
        import torch

        torch.mm(*self.torch)
        if self.device == "cuda":
            torch.cuda.synchronize()

    def run(self, threads=None):
        for _ in range(2):
            start = time.perf_counter()
            self.dot(self.a, self.b).block_until_ready()
            self.times["jax"].append(time.perf_counter() - start)
        if self.torch is not None:
            import torch

            if threads:
                torch.set_num_threads(threads)
            for _ in range(2):
                start = time.perf_counter()
                self._torch_mm()
                self.times["torch"].append(time.perf_counter() - start)

    def flops(self):
        work = 2.0 * self.N**3
        return {k: work / min(v) for k, v in self.times.items() if v}  # best observed: the peak


def pick_torch_threads(config, log) -> tuple[int, dict]:
    """PyTorch's intra-op threads: the faster of 1 and all cores on this machine, now (its
    OpenMP barriers suffer badly when other processes share the cores)."""
    import torch
    from torch_model import Trainer

    cores = os.cpu_count() or 1
    candidates = sorted({1, cores})
    trainer = Trainer(4, length=config.model.seq_len, batch_size=config.data.batch_size)
    trainer.run(1)
    times = {t: [] for t in candidates}
    for _ in range(2):
        for t in candidates:
            torch.set_num_threads(t)
            start = time.perf_counter()
            trainer.run(1)
            times[t].append(time.perf_counter() - start)
    seconds = {t: min(v) for t, v in times.items()}
    best = min(seconds, key=seconds.get)
    log(f"torch threads: {', '.join(f'{t}: {1000 * s:.0f} ms' for t, s in seconds.items())} per H=4 step -> {best}")
    return best, seconds
