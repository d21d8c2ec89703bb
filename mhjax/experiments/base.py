"""The contract between an experiment and the generic trainer, TensorBoard writer and report.

An experiment turns a config into sweep members and compiled programs. The trainer
(``mhjax.train``) calls only the methods below; the optional hooks have no-op defaults,
so the generic code never asks what kind of experiment it runs.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, NamedTuple

import numpy as np

from mhjax.train.console import SummaryTable
from mhjax.train.engine import Program, TrainedProgram
from mhjax.train.members import Member


class FigureRequest(NamedTuple):
    """Figures to draw: ``name`` a plotting entry (mhjax.plotting.FIGURES), ``data`` its keywords."""

    name: str
    data: dict


STRATEGIES = ("auto", "unrolled", "fused", "grouped", "one_program")  # how the trainer may lay out a sweep


class Experiment:
    """Subclasses set ``kind`` and ``members`` and implement the four required methods."""

    kind: str = ""
    analyzable: bool = False  # `mhjax analyze --workdir` can read its members (Transformer attention)
    # Why a finished workdir cannot train longer (a larger config.train.steps); None: it can.
    cannot_extend: str | None = None
    analyzes_states: bool = False  # Run.analyze(steps=...) evaluates kept states (analyze_states)
    # TensorBoard's train/... scalars at every step W/trace keeps (io/trace.kept: every step up to
    # 10^4, log-spaced beyond) instead of means over windows of a chunk (io/curves.train_window)
    log_every_step: bool = False
    # report/curves.png: the member fields told apart by line style and by colour (plotting/curves.py),
    # and the tags (substrings) drawn on log-log axes, where a rate is a slope
    curve_style: str = "seed"
    curve_colour: str = "heads"
    log_curves: tuple[str, ...] = ()
    # {dotted field: default} of the optional fields a config may leave out (its config module's
    # DEFAULTS): a resume compares the recorded config and its own with them filled (io/metadata.resolved)
    config_defaults: dict = {}
    config: Any
    members: list[Member]
    # The devices the sweep is planned for where they are not this machine's (a compile target's,
    # train/deviceless.py): programs and ``auto`` choices are made for them. None: this machine's.
    planned_devices: int | None = None

    # -- required ----------------------------------------------------------------
    def programs(self, strategy: str, backend: str) -> list[Program]:
        """The sweep's compiled programs under ``strategy`` on ``backend``."""
        raise NotImplementedError

    def member_constants(self, member: Member):
        """One member's numeric settings (keys, head count, step size, data...) as the
        experiment's NamedTuple (experiments/constants.py): numpy leaves, stacked over each
        program's members and passed to its recipe."""
        raise NotImplementedError

    def member_info(self, member: Member) -> dict:
        """Static facts for results.json (at least ``params``)."""
        raise NotImplementedError

    def describe(self, backend: str) -> list[str]:
        """Lines of ``mhjax train --dry-run`` after the header (members, cost, memory). This
        default: each member's facts, then the FLOPs and memory of each program's training chunk
        from XLA's analysis of it compiled here (train/compiled_cost.py: seconds, nothing runs)."""
        from mhjax.train import compiled_cost

        members = [f"{m.name:<28} {self.member_info(m)}" for m in self.members]
        return members + compiled_cost.lines(compiled_cost.chunk_costs(self, backend), backend)

    def keep_names(self, recorded) -> None:
        """Members take back the names a workdir recorded (``recorded``: its member names, or
        their checkpoint keys) where an earlier mhjax named them otherwise (``Member.earlier``):
        resuming and training longer keep the names of checkpoints, TensorBoard runs and results.
        The PRNG keys derive from a member's fields, never its name: nothing else changes."""
        from mhjax.io.checkpoint import member_key  # orbax imports slowly: only here

        recorded = {member_key(n) for n in recorded}
        renamed = {
            m.name: m.earlier
            for m in self.members
            if m.earlier and member_key(m.name) not in recorded and member_key(m.earlier) in recorded
        }
        self.rename(renamed)

    def rename(self, names: dict[str, str]) -> None:
        """Members take the names ``names`` maps their names to (a workdir's recorded names);
        the PRNG keys derive from a member's fields, never its name: nothing else changes."""
        if not names:
            return
        self.members = [dataclasses.replace(m, name=names.get(m.name, m.name)) for m in self.members]
        if isinstance(getattr(self, "_key_names", None), dict):  # {member name: key name} of the experiments
            self._key_names = {names.get(k, k): v for k, v in self._key_names.items()}

    def subset(self, names) -> Experiment:
        """A copy that trains only the members named ``names`` (in the sweep's order), with the
        same config: a sweep that grew trains its new members alone (workflows/growth.py)."""
        names = set(names)
        part = copy.copy(self)
        part.members = [m for m in self.members if m.name in names]
        part.regroup()
        return part

    def regroup(self) -> None:
        """Recompute what the experiment derived from its member list (after ``subset``)."""

    # -- optional hooks (no-op defaults) ------------------------------------------
    @classmethod
    def restore_plugins(cls, metadata: dict, where: str) -> None:
        """Register again the plug-ins W/mhjax.json (``metadata``, read from ``where``) says the
        run used, before the experiment is made from its config."""

    # -- a trained run from Python (mhjax.load): what an experiment offers -------
    def seed_data(self, seed: int):
        raise self._unavailable("data")

    def theta0(self, name: str):
        raise self._unavailable("theta0")

    def model(self, name: str):
        raise self._unavailable("model")

    def ntk(self, name: str, padded_params, step: int):
        raise self._unavailable("ntk")

    def analyze_states(self, states: dict, log=None):
        raise self._unavailable("analyze(steps=...)")

    def _unavailable(self, what: str) -> Exception:
        from mhjax.config import ConfigError

        return ConfigError(f"run.{what}: not available for a {self.kind} sweep")

    @classmethod
    def record_model(cls, record: dict, config: dict):
        """A pure apply(params, x) of a member built from its results entry and the run's config
        alone (no plug-in code runs), or None: ``Run.model`` then makes the experiment."""
        return None

    @classmethod
    def stored_params(cls, record: dict, params):
        """A member's parameters as a user sees them, from the checkpoint's tree (``record``: the
        member's results.json entry), e.g. cut to its own head count."""
        return params

    def divergence_factor(self) -> float:
        """A member whose training loss ever exceeds this times its step-0 loss is "diverged"
        (train/status.py; its recipes' ``divergence_factor``); 0: only a non-finite loss is."""
        return 0.0

    def metadata(self) -> dict:
        """Extra fields of W/mhjax.json (e.g. where plug-in tasks came from)."""
        return {}

    def source_label(self, where: str) -> str:
        """How a message names the plug-in that ``metadata()`` records at ``where`` (dotted, e.g.
        "tasks.marker": io/metadata.source_changes)."""
        return f"plug-in {where}"

    def notes(self) -> list[str]:
        """Console lines shown before training and by --dry-run (e.g. config entries ignored)."""
        return []

    def check_start(self) -> None:
        """Before training (and before the workdir is written): raise ConfigError when the
        members' start cannot train (e.g. a non-finite loss at theta_0)."""

    def check_chunk(self, program: Program, metrics: dict, step: int) -> dict:
        """After each chunk, once its metrics (host numpy, rows (steps, members of ``program``)
        from step ``step`` on) are on the host and before anything of it is logged or saved: raise
        ConfigError to stop the run (e.g. a target outside the vocabulary); return the metrics
        the loop logs (without values only this check reads)."""
        return metrics

    def extra_results(self, trained: list[TrainedProgram], loss_curves: dict[int, dict]) -> dict[int, dict]:
        """{member index: extra results.json fields} computed from the final states: ``trained``
        holds every program with its stacked constants and states, ``loss_curves`` the exact
        losses the trainer recorded at ``loss_steps()`` ({member index: {"steps", "values"}}, and
        "zero_at_step" once a step's loss was 0: train/records.py)."""
        return {}

    def results_fields(self, backend: str) -> dict:
        """Extra top-level results.json fields (e.g. how the run computed what it did)."""
        return {}

    def evaluation_fields(self, index: int, metrics: dict) -> dict:
        """Member ``index``'s evaluation (host floats) with fields derived from it, logged at every
        evaluation and kept in results.json (e.g. a loss in bits)."""
        return metrics

    def learning_rates(self, indices: list[int], first_step: int, length: int):
        """(length, members) learning rates of the members ``indices`` at the steps from
        ``first_step`` on, from the schedule on the host (train/learning_rate at every step), or
        None: the optimizer's own rate at each chunk's end."""
        return None

    def throughput(self, member_steps_per_s: float) -> dict:
        """Rates derived from member-steps/s (e.g. {"tokens_per_s", "mfu"}; None where unknown),
        in the console's last line, results.json and TensorBoard (perf/...)."""
        return {}

    def result_notes(self, payload: dict) -> list[str]:
        """Console lines once the results are written (``payload``: what results.json holds), e.g.
        members no better than a baseline."""
        return []

    def step_seconds(self, program: Program, backend: str) -> float:
        """A program's predicted time per step on ``backend``, by which ``--shard`` shares a sweep
        (workflows/shards.py); default: its member count (every member alike)."""
        return float(len(program.members))

    def estimated_bytes_per_member_step(self, backend: str, devices: int) -> float | None:
        """A cost model's memory traffic per member-step on ``backend`` (None: no model), shown
        beside what the compiled program moves (``train --dry-run --target``)."""
        return None

    def estimated_dot_flops_per_member_step(self, backend: str, devices: int) -> float | None:
        """The cost model's matmul FLOPs per member-step on ``backend`` (None: no model)."""
        return None

    def kernel_fallback(self, backend: str, reason: str) -> bool:
        """A program failed to compile on ``backend`` (``reason``: the error's first line). If
        the experiment chose a kernel there itself, switch to its path without it from now on
        (``programs`` then returns the same programs without the kernel) and return True: the
        trainer compiles again. False (the default): the failure stands."""
        return False

    def metric_tags(self) -> list[str]:
        """TensorBoard tags filled in later (e.g. by ``mhjax analyze``), listed as HParams metrics."""
        return []

    def eval_steps(self) -> list[int]:
        """Steps at which to evaluate besides every ``train.eval_every`` (0 = before training;
        another k: at the end of the chunk that contains it)."""
        return []

    def loss_steps(self) -> list[int]:
        """Steps k at which the trainer records the exact train loss L(theta_k) of every member
        (results field ``loss_curve``; handed to ``extra_results``)."""
        return []

    def images(self, member_states: dict, step: int) -> dict[str, dict[str, np.ndarray]]:
        """{member name: {tag: RGB uint8 image (H, W, 3)}} logged at the end of training;
        ``member_states`` maps member names to their own host MemberState."""
        return {}

    def attention_maps(self, member_states: dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """{member name: (every head's attention (L, H, T, T), the combined operator (L, T, T))}
        on a fixed sequence, which the trainer draws into the member's TensorBoard run at the end
        of training (plotting/images.member_images): data only, an experiment draws nothing."""
        return {}

    def summary_table(self) -> SummaryTable | None:
        """The table `mhjax train` prints at the end: rows over the experiment's own swept
        fields, columns the final results averaged over each row's seeds; None: no table."""
        return None

    def swept_fields(self, *first: str) -> tuple[str, ...]:
        """``first``, then every other field the config sweeps over more than one value, seeds
        excepted (rows average over seeds); ``task_params`` after ``task`` when the config sets
        any task parameter (members with other parameter values are other rows)."""
        more = [f for f, values in self.config.sweep.items() if len(values) > 1 and f not in (*first, "seed")]
        fields = [*first, *more]
        if "task" in fields and self.config.get("task_params"):
            fields.insert(fields.index("task") + 1, "task_params")
        return tuple(fields)

    def figures(self, payload: dict) -> list[FigureRequest]:
        """The experiment's figures and summaries, as data for the plotting layer
        (mhjax.plotting.draw), once the results are written (``payload``: what results.json holds)."""
        return []
