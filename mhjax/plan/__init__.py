"""How a sweep runs, apart from what it trains: one ``Plan`` per backend and device count.

From an experiment's members and their shapes (``Experiment.sweep_shapes``: plain sizes, no
experiment code), its config and the backend (this machine's or a compile target's), ``make``
computes once: the strategy (``auto`` resolved: plan/strategy.py) and the programs it lays out
(``Experiment.layout``), the attention path with its reason and fallback (plan/attention.py),
memory per device and whether the JAX path fits (plan/memory.py), the cost model's prediction
(plan/pricing.py) and the dry run's lines (plan/lines.py). Every consumer reads it: the train
loop's programs (train/loop.Sweep), ``--dry-run`` and ``--target`` (workflows/train.describe,
train/deviceless.py), ``--shard``'s shares (workflows/shards.py), results.json's attention fields
and ``mhjax.compile_for``. Each distinct model is traced (its parameter count) once, by
construction (plan/shapes.py).

The planner knows no experiment class: it reads an experiment's ``config`` (strategy, devices,
train.steps), ``members``, ``sweep_shapes()`` and ``layout(strategy, attention, devices)``. An
experiment without shapes (the mixture) is laid out as asked and described by XLA's account of
its compiled chunks (train/compiled_cost.py).
"""

from __future__ import annotations

import functools

import jax

from mhjax.models.attention_choice import AUTO, KERNELS, AttentionChoice
from mhjax.plan import attention, lines, memory, pricing, strategy
from mhjax.plan.shapes import Group, SweepShapes
from mhjax.plan.strategy import STRATEGIES
from mhjax.train.engine import Program

__all__ = ["STRATEGIES", "Group", "Plan", "SweepShapes", "devices_of", "make"]


def devices_of(config) -> int:
    """This machine's devices the member axis is sharded over (config.devices caps them; 0 = all)."""
    count = int(config.get("devices", 0) or 0)
    return min(count, jax.device_count()) if count else jax.device_count()


class Plan:
    """How ``experiment``'s sweep runs on ``backend`` over ``devices`` (see the module's words).

    backend, devices; planned: for a compile target, not this machine; requested: config.strategy;
    strategy: auto resolved (None where the experiment has no shapes); attention: the
    AttentionChoice (None without shapes); core: what computes the attention core of the programs
    (a traced head count keeps the JAX path: AttentionChoice.core); programs: the layout."""

    def __init__(self, experiment, backend: str, devices: int, planned: bool, failed: str | None = None):
        self.experiment, self.backend, self.devices, self.planned = experiment, backend, devices, planned
        self.failed = failed  # why auto's kernel failed to compile here (without_kernel), else None
        self.steps = int(experiment.config.train.steps)
        self.names = [m.name for m in experiment.members]
        self.requested = experiment.config.get("strategy", "auto")
        self.shapes: SweepShapes | None = experiment.sweep_shapes()
        self._prices: dict = {}
        self._layouts: dict = {}
        self._auto: str | None = None  # auto's choice, once asked for
        self.attention: AttentionChoice | None = None
        self.strategy = self.core = None
        if self.shapes is not None:
            self.attention = attention.choose(self.shapes, backend, failed)
            self.strategy = self.resolve(self.requested)
            self.core = self.attention.core(self.shapes.traced(self.strategy))

    @functools.cached_property
    def programs(self) -> list[Program]:
        """The plan's programs (config.strategy's, auto resolved)."""
        return self.programs_for(self.requested)

    def resolve(self, strategy_: str) -> str:
        """``strategy_``, auto resolved for the plan's backend and devices (plan/strategy.py)."""
        if strategy_ != "auto" or self.shapes is None:
            return strategy_
        if self._auto is None:
            self._auto = strategy.auto(self, self.devices)
        return self._auto

    def programs_for(self, strategy_: str) -> list[Program]:
        """The programs under ``strategy_`` (auto: auto's choice), laid out by the experiment for the
        plan's attention and devices; auto's JAX path that would not fit: ConfigError (plan/memory.py)."""
        strategy_ = self.resolve(strategy_)
        if strategy_ not in self._layouts:
            if self.shapes is not None:
                core = self.attention.core(self.shapes.traced(strategy_))
                memory.check(self.shapes, self.attention, core, self.devices)
            self._layouts[strategy_] = self.experiment.layout(strategy_, self.attention, self.devices)
        return self._layouts[strategy_]

    def predict(self, strategy_: str | None = None, devices: int | None = None, dtype: str | None = None) -> dict:
        """models/cost.sweep_cost of ``strategy_``'s programs (default: the plan's) over ``devices``
        of the backend's device preset (default: the plan's), in ``dtype`` (default: model.dtype)."""
        key = (strategy_ or self.strategy, devices or self.devices, dtype)
        if key not in self._prices:
            self._prices[key] = pricing.price(self.shapes, self.programs_for(key[0]), self.backend, key[1], dtype)
        return self._prices[key]

    def price(self, programs: list[Program], devices: int | None = None, dtype: str | None = None) -> dict:
        """models/cost.sweep_cost of ``programs``, each at its own model's shape."""
        return pricing.price(self.shapes, programs, self.backend, devices or self.devices, dtype)

    def step_seconds(self, program: Program) -> float:
        """A program's time per step alone on one device: models/cost.py's where the experiment has
        shapes, else its member count (every member alike), by which ``--shard`` shares a sweep."""
        if self.shapes is None:
            return float(len(program.members))
        return len(program.members) / self.price([program], devices=1)["member_steps_per_s"]

    def estimate(self, key: str) -> float | None:
        """The cost model's ``key`` (e.g. compiled_bytes_per_member_step, dot_flops_per_member_step)
        for the plan's programs, shown beside what the compiled program does; None: no model."""
        return None if self.shapes is None else self.predict()[key]

    def results_fields(self) -> dict:
        """results.json's record of how the run computed attention (and why it fell back)."""
        if self.attention is None:
            return {}
        fallback = self.attention.fallback
        return {"attention": self.core, **({"attention_fallback": fallback} if fallback else {})}

    def without_kernel(self, reason: str) -> Plan | None:
        """The plan after auto's kernel failed to compile here (``reason``: the error's first
        line): the same programs on the JAX path; None where auto did not choose a kernel (the
        failure stands)."""
        choice = self.attention
        if choice is None or choice.requested != AUTO or choice.implementation not in KERNELS:
            return None
        failed = f"the Pallas kernel failed to compile: {reason}"
        return Plan(self.experiment, self.backend, self.devices, self.planned, failed)

    def accelerator(self) -> Plan:
        """What one GPU would run (a CPU's dry run predicts for one, models/cost.py's preset)."""
        return Plan(self.experiment, "gpu", 1, self.planned)

    def lines(self) -> list[str]:
        """Lines of ``mhjax train --dry-run`` after the header (plan/lines.py)."""
        return lines.describe(self)


def make(experiment, backend: str, devices: int | None = None, planned: bool = False) -> Plan:
    """``experiment``'s plan on ``backend`` over ``devices`` (default: this machine's,
    config.devices capping them); ``planned``: for a compile target, not this machine."""
    return Plan(experiment, backend, devices or devices_of(experiment.config), planned)
