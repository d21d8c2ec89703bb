"""The contract between an experiment and the generic planner, trainer, TensorBoard writer and report.

An experiment says what a sweep trains (members, their model shapes, data, loss, evaluation)
and how it is recorded, drawn and analysed; how it runs (strategy, attention path, memory,
cost, devices) is the planner's (``mhjax.plan``), which reads the experiment's shapes. The
generic code calls only the methods below, grouped by concern in ``Experiment``'s docstring;
the optional hooks have no-op defaults, so the generic code never asks what kind of
experiment it runs (docs/layout.md: what a new kind defines).
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, NamedTuple

import numpy as np

from mhjax.models.attention_choice import AttentionChoice
from mhjax.plan import Plan, SweepShapes
from mhjax.plan import make as make_plan
from mhjax.train.console import SummaryTable
from mhjax.train.engine import Program, TrainedProgram
from mhjax.train.members import Member


class FigureRequest(NamedTuple):
    """Figures to draw: ``name`` a plotting entry (mhjax.plotting.FIGURES), ``data`` its keywords."""

    name: str
    data: dict


class Experiment:
    """What a sweep trains, records, draws and analyses; how it runs is the planner's (mhjax.plan).

    Hooks by concern. Required (no default): ``kind``, ``members``, ``config``, ``layout``,
    ``member_constants`` and ``member_info``; every other hook is optional, its default a no-op.

    What is trained -- required: ``members`` (train/members.Member, in sweep order),
    ``layout(strategy, attention, devices)`` (the programs), ``member_constants(member)``;
    optional: ``sweep_shapes`` (the members' model shapes: without them the planner prices
    nothing and the dry run shows XLA's account of the compiled chunks), ``regroup``,
    ``divergence_factor``, ``check_start``, ``check_chunk``, ``eval_steps``, ``loss_steps``,
    ``learning_rates``, ``notes``, ``restore_plugins``, ``cannot_extend``, ``config_defaults``.
    Records and tables -- required: ``member_info``; optional: ``results_fields``,
    ``evaluation_fields``, ``extra_results``, ``throughput``, ``result_notes``, ``summary_table``
    (``swept_fields`` helps), ``metric_tags``, ``metadata``, ``source_label``.
    Figures -- optional: ``figures``, ``images``, ``attention_maps``, ``log_every_step``,
    ``curve_style``, ``curve_colour``, ``log_curves``.
    Analysis (a trained run from Python, mhjax.load) -- optional: ``analyzable``,
    ``analyzes_states``, ``seed_data``, ``theta0``, ``model``, ``ntk``, ``analyze_states``,
    ``record_model``, ``stored_params``.
    Provided here, not overridden: ``plan`` and ``programs`` (the planner's), ``keep_names``,
    ``rename``, ``subset``.
    """

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

    # -- what is trained: required -----------------------------------------------------------------
    def layout(self, strategy: str, attention: AttentionChoice | None, devices: int) -> list[Program]:
        """The sweep's compiled programs under ``strategy`` (never auto: the planner resolved it),
        computing attention as ``attention`` says (None where ``sweep_shapes`` is None), for a
        member axis split over ``devices``."""
        raise NotImplementedError

    def member_constants(self, member: Member):
        """One member's numeric settings (keys, head count, step size, data...) as the
        experiment's NamedTuple (experiments/constants.py): numpy leaves, stacked over each
        program's members and passed to its recipe."""
        raise NotImplementedError

    def member_info(self, member: Member) -> dict:
        """Static facts for results.json (at least ``params``)."""
        raise NotImplementedError

    # -- what is trained: optional -----------------------------------------------------------------
    def sweep_shapes(self) -> SweepShapes | None:
        """The members' model shapes, which the planner prices and chooses attention for
        (plan/shapes.py); None: the experiment lays itself out and no cost model prices it."""
        return None

    def regroup(self) -> None:
        """Recompute what the experiment derived from its member list (after ``subset``)."""

    @classmethod
    def restore_plugins(cls, metadata: dict, where: str) -> None:
        """Register again the plug-ins W/mhjax.json (``metadata``, read from ``where``) says the
        run used, before the experiment is made from its config."""

    def divergence_factor(self) -> float:
        """A member whose training loss ever exceeds this times its step-0 loss is "diverged"
        (train/status.py; its recipes' ``divergence_factor``); 0: only a non-finite loss is."""
        return 0.0

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

    def eval_steps(self) -> list[int]:
        """Steps at which to evaluate besides every ``train.eval_every`` (0 = before training;
        another k: at the end of the chunk that contains it)."""
        return []

    def loss_steps(self) -> list[int]:
        """Steps k at which the trainer records the exact train loss L(theta_k) of every member
        (results field ``loss_curve``; handed to ``extra_results``)."""
        return []

    def learning_rates(self, indices: list[int], first_step: int, length: int):
        """(length, members) learning rates of the members ``indices`` at the steps from
        ``first_step`` on, from the schedule on the host (train/learning_rate at every step), or
        None: the optimizer's own rate at each chunk's end."""
        return None

    # -- records and tables (results.json, TensorBoard, the console): optional ---------------------
    def results_fields(self, backend: str) -> dict:
        """Extra top-level results.json fields (e.g. how the run computed what it did)."""
        return {}

    def evaluation_fields(self, index: int, metrics: dict) -> dict:
        """Member ``index``'s evaluation (host floats) with fields derived from it, logged at every
        evaluation and kept in results.json (e.g. a loss in bits)."""
        return metrics

    def extra_results(self, trained: list[TrainedProgram], loss_curves: dict[int, dict]) -> dict[int, dict]:
        """{member index: extra results.json fields} computed from the final states: ``trained``
        holds every program with its stacked constants and states, ``loss_curves`` the exact
        losses the trainer recorded at ``loss_steps()`` ({member index: {"steps", "values"}}, and
        "zero_at_step" once a step's loss was 0: train/records.py)."""
        return {}

    def throughput(self, member_steps_per_s: float) -> dict:
        """Rates derived from member-steps/s (e.g. {"tokens_per_s", "mfu"}; None where unknown),
        in the console's last line, results.json and TensorBoard (perf/...)."""
        return {}

    def result_notes(self, payload: dict) -> list[str]:
        """Console lines once the results are written (``payload``: what results.json holds), e.g.
        members no better than a baseline."""
        return []

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

    def metric_tags(self) -> list[str]:
        """TensorBoard tags filled in later (e.g. by ``mhjax analyze``), listed as HParams metrics."""
        return []

    def metadata(self) -> dict:
        """Extra fields of W/mhjax.json (e.g. where plug-in tasks came from)."""
        return {}

    def source_label(self, where: str) -> str:
        """How a message names the plug-in that ``metadata()`` records at ``where`` (dotted, e.g.
        "tasks.marker": io/metadata.source_changes)."""
        return f"plug-in {where}"

    # -- figures: optional -------------------------------------------------------------------------
    def figures(self, payload: dict) -> list[FigureRequest]:
        """The experiment's figures and summaries, as data for the plotting layer
        (mhjax.plotting.draw), once the results are written (``payload``: what results.json holds)."""
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

    # -- analysis of a trained run from Python (mhjax.load): optional ------------------------------
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

    # -- provided here: how the sweep runs (mhjax.plan) and which members it has -------------------
    def plan(self, backend: str, devices: int | None = None, planned: bool = False) -> Plan:
        """The sweep's plan on ``backend`` (this machine's or a target's, ``planned``) over
        ``devices`` (default: this machine's, config.devices capping them): mhjax.plan.make."""
        return make_plan(self, backend, devices, planned=planned)

    def programs(self, strategy: str, backend: str) -> list[Program]:
        """The programs under ``strategy`` (auto: the plan's choice) on ``backend``."""
        return self.plan(backend).programs_for(strategy)

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
