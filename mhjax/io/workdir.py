"""A sweep's workdir: every file name in it and every reader of it.

    W/mhjax.json              metadata: mhjax version, experiment kind, resolved config, where plug-in
                              tasks came from (written first)
    W/.mhjax.lock             one command at a time (io/lock.py)
    W/.mhjax.write.lock       a short lock around the writes shards share (io/shared_write.py)
    W/mhjax.log               library logs of `mhjax train`
    W/checkpoints/<step>/     orbax step directories: member states and host records (io/checkpoint.py)
    W/snapshots/<step>/       every member's parameters at config.train.snapshot_steps, kept for good
    W/grown/<n>/checkpoints/, W/grown/<n>/snapshots/   the same of members a sweep grew by (io/parts.py)
    W/shards/<i>/checkpoints/, W/shards/<i>/snapshots/, W/shards/<i>/.mhjax.lock   shard i's (--shard i/N)
    W/tb/<member>/            each member's TensorBoard run (io/tensorboard.py)
    W/trace/<member>.bin      per-step scalars a recipe traces, and format.json (io/trace.py)
    W/results.json, .md       written when training ends (io/results.py)
    W/eval_windows/           per-window held-out losses of each member (io/window_files.py)
    W/analysis/analysis.*     `mhjax analyze --workdir W`
    W/report.md, W/report/    `mhjax report --workdir W`
    W/<figure>.png, <name>.md an experiment's own figures and summaries (Experiment.figures, drawn by plotting)

No other module of mhjax names these files: they ask a ``Workdir``. Its readers keep what they
read, so a command holding one Workdir reads an unchanged file once, and read it again once it
changed (a Run held while its sweep trains follows it). A missing or unreadable file is a
one-line ConfigError naming it, never a default: a workdir without an analysis or without
TensorBoard runs says so through ``has_analysis()`` and ``has_curves()``.
"""

from __future__ import annotations

import json
import os

from mhjax.config import ConfigError
from mhjax.io import halved, parts, results_files, window_files
from mhjax.io.cached_reads import CachedReads
from mhjax.io.metadata import check_or_write
from mhjax.io.results import write_json
from mhjax.io.shared_write import SharedWrite

ANALYSIS_FILES = {"json": "analysis.json", "md": "analysis.md", "png": "analysis.png"}


def analysis_paths(folder) -> dict[str, str]:
    """{"json", "md", "png": path} of an analysis written to ``folder`` (a workdir's or --out)."""
    return {kind: os.path.join(str(folder), name) for kind, name in ANALYSIS_FILES.items()}


class Workdir(CachedReads):
    METADATA = "mhjax.json"
    LOCK = ".mhjax.lock"
    LOG = "mhjax.log"
    CHECKPOINTS = "checkpoints"
    SNAPSHOTS = "snapshots"
    TENSORBOARD = "tb"
    TRACE = "trace"
    RESULTS = "results.json"
    RESULTS_TABLE = "results.md"
    ANALYSIS = "analysis"
    REPORT = "report.md"
    REPORT_FIGURES = "report"

    def __init__(self, path):
        self.path = os.fspath(path)
        self._read: dict = {}  # what the readers have read: {key: (signature of its file, value)}
        # A part of a sweep that grew (io/parts.py): its checkpoints and snapshots in W/<folder>/,
        # and the sweep's member names in order; None: the whole sweep, every part together. A
        # shard's program_names: {member: its program's name in the one-job run} (io/parts.merge).
        self.folder, self.order, self.program_names = "", None, None

    def part(self, folder: str, order: list[str]) -> Workdir:
        """The view of one part (``folder``: "" for the first run's): its own checkpoints and
        snapshots, the shared TensorBoard runs and traces; results it writes join the others'."""
        view = Workdir(self.path)
        view.folder, view.order = folder, list(order)
        return view

    def part_folders(self) -> list[str]:
        """The folders of the sweep's parts: [""] unless it grew; a part's view: its own."""
        if self.order is not None or not os.path.isfile(self.metadata_path):
            return [self.folder]
        return parts.folders(self.metadata(), self.metadata_path)

    def _grown(self) -> list[Workdir]:
        """The parts' views of a whole sweep that grew; [] otherwise."""
        folders = self.part_folders()
        return [self.part(f, []) for f in folders] if len(folders) > 1 else []

    @classmethod
    def of(cls, workdir) -> Workdir:
        return workdir if isinstance(workdir, Workdir) else cls(workdir)

    def __fspath__(self) -> str:
        return self.path

    def __str__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"Workdir({self.path!r})"

    # ------------------------------------------------------------------ #
    # Paths
    # ------------------------------------------------------------------ #
    def file(self, name: str) -> str:
        """A file at the top of the workdir (an experiment's figures and summaries)."""
        return os.path.join(self.path, name)

    @property
    def metadata_path(self) -> str:
        return self.file(self.METADATA)

    @property
    def lock_path(self) -> str:
        return self.file(self.LOCK)

    def shard_lock_path(self, index: int) -> str:  # held while shard ``index`` trains (io/lock.py)
        return self.file(os.path.join(parts.shard_folder(index), self.LOCK))

    def shard_count(self) -> int | None:  # N of a sweep trained as N shards (--shard I/N), else None
        return parts.shard_count(self.metadata()) if os.path.isfile(self.metadata_path) else None

    @property
    def log_path(self) -> str:
        return self.file(self.LOG)

    @property
    def checkpoints_dir(self) -> str:
        return os.path.abspath(self.file(os.path.join(self.folder, self.CHECKPOINTS)))

    @property
    def snapshots_dir(self) -> str:
        return os.path.abspath(self.file(os.path.join(self.folder, self.SNAPSHOTS)))

    @property
    def tensorboard_dir(self) -> str:
        return self.file(self.TENSORBOARD)

    @property
    def trace_dir(self) -> str:
        return self.file(self.TRACE)

    def run_dir(self, member: str) -> str:
        """The TensorBoard run of ``member``."""
        return os.path.join(self.tensorboard_dir, member)

    @property
    def results_path(self) -> str:
        return self.file(self.RESULTS)

    @property
    def analysis_dir(self) -> str:
        return self.file(self.ANALYSIS)

    @property
    def analysis_path(self) -> str:
        return analysis_paths(self.analysis_dir)["json"]

    @property
    def report_path(self) -> str:
        return self.file(self.REPORT)

    @property
    def report_dir(self) -> str:
        return self.file(self.REPORT_FIGURES)

    # ------------------------------------------------------------------ #
    # Readers (each file read once per Workdir while it is unchanged)
    # ------------------------------------------------------------------ #
    def require(self) -> None:
        if not os.path.isdir(self.path):
            raise ConfigError(f"--workdir: no such directory: {self.path}")

    def _json(self, path: str, missing_hint: str) -> dict:
        def load() -> dict:
            self.require()
            if not os.path.isfile(path):
                raise ConfigError(f"--workdir: {self.path} has no {os.path.relpath(path, self.path)}; {missing_hint}")
            try:
                with open(path) as f:
                    data = json.load(f)
            except (OSError, ValueError) as exc:  # ValueError: JSON and UTF-8 decoding errors
                raise ConfigError(f"--workdir: {path} is unreadable ({type(exc).__name__})") from None
            if not isinstance(data, dict):
                raise ConfigError(f"--workdir: {path} is not a JSON object")
            return data

        return self._cached(path, path, load)

    def metadata(self) -> dict:
        """W/mhjax.json: {"mhjax_version", "experiment", "config"}."""
        return self._json(self.metadata_path, "not a mhjax sweep workdir")

    def config(self) -> dict:
        """The resolved config the sweep was trained with (a plain dict)."""
        config = self.metadata().get("config")
        if not isinstance(config, dict):
            raise ConfigError(f"--workdir: {self.metadata_path} has no config object")
        return config

    def config_field(self, dotted: str):
        """One field of the config, e.g. ``model.seq_len``; missing: a one-line error naming it."""
        node = self.config()
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                raise ConfigError(f"--workdir: {self.metadata_path} has no config.{dotted}")
            node = node[part]
        return node

    def sweep_fields(self) -> list[str]:
        """The config's swept fields, in order, and ``task_params`` after ``task`` when the config
        sets any task parameter (config.task_params): its members' parameters tell rows apart."""
        fields = list(self.config_field("sweep"))
        if not self.config().get("task_params"):
            return fields
        at = fields.index("task") + 1 if "task" in fields else 0
        return fields[:at] + ["task_params"] + fields[at:]

    def results(self) -> dict:
        """W/results.json, with its ``members`` list."""
        results = self._json(
            self.results_path,
            f"it is written when training ends (mhjax train --config ... --workdir {self.path}); while the sweep "
            "trains, mhjax.load(W).status(), .member_names and .curves(name) follow it",
        )
        if not isinstance(results.get("members"), list):
            raise ConfigError(f"--workdir: {self.results_path} has no member list")
        return results

    def member_names(self) -> list[str]:
        return [m["name"] for m in self.results()["members"]]

    def missing_members(self) -> list[str]:  # results.json's members still to come (shards to finish)
        missing = self.results().get(parts.MISSING, []) if os.path.isfile(self.results_path) else []
        return [str(n) for n in missing] if isinstance(missing, list) else []

    def recorded_names(self) -> list[str]:
        """The member names the workdir's run gave: results.json's, else the checkpoint keys of
        its latest checkpoint (a run stopped before its first results); [] for a new workdir."""
        if os.path.isfile(self.results_path):
            return self.member_names()
        # From the step folders and their metadata, no CheckpointManager: each process of a
        # distributed run calls this, and creating a manager is a barrier the others do not reach.
        from mhjax.io.checkpoint import stored_member_keys  # orbax imports slowly: only here

        names = []
        for view in self._grown() or [self]:
            steps = parts.steps_in(view.checkpoints_dir)
            names += stored_member_keys(view.checkpoints_dir, steps[-1]) if steps else []
        return names

    def has_analysis(self) -> bool:
        return os.path.exists(self.analysis_path)

    def analysis(self) -> dict:
        """W/analysis/analysis.json (``mhjax analyze --workdir W``)."""
        return self._json(self.analysis_path, f"run `mhjax analyze --workdir {self.path}` first")

    def has_curves(self, member: str | None = None) -> bool:
        """Whether the workdir has TensorBoard runs at all (W/tb), or ``member``'s run (a writer
        that could not open its folder, e.g. on a full disk, leaves none: the run went on)."""
        return os.path.isdir(self.tensorboard_dir if member is None else self.run_dir(member))

    def curves(self, member: str, tags=None) -> dict:
        """{tag: (steps, values)} of ``member``'s TensorBoard scalars, ``tags`` (absent ones left
        out) or all; read again only when its event files changed. A resumed run may log a step
        twice: the last value wins."""
        path = self.run_dir(member)

        def load() -> dict:
            from mhjax.io.curves import read_run  # tensorboard's reader imports slowly: only here

            if not os.path.isdir(path):
                raise ConfigError(f"--workdir: {self.path} has no TensorBoard run {path}")
            return read_run(path)

        run = self._cached(("curves", member), path, load)
        return dict(run) if tags is None else {t: run[t] for t in tags if t in run}

    # ------------------------------------------------------------------ #
    # Checkpoints
    # ------------------------------------------------------------------ #
    def checkpointer(self, keep: int = 2):
        """The workdir's SweepCheckpointer (close it when done)."""
        from mhjax.io.checkpoint import SweepCheckpointer  # orbax imports slowly: only here

        return SweepCheckpointer(self.checkpoints_dir, keep=keep)

    def snapshotter(self):
        """The SweepCheckpointer of W/snapshots, which keeps every step (close it when done)."""
        from mhjax.io.checkpoint import SweepCheckpointer

        return SweepCheckpointer(self.snapshots_dir, keep=None)

    def has_checkpoints(self) -> bool:  # of a sweep in parts: any part's (a shard's)
        return any(os.path.isdir(view.checkpoints_dir) for view in self._grown() or [self])

    def checkpoint_steps(self) -> list[int]:
        """The steps of the complete checkpoints kept, ascending (orbax names a step's folder by
        its number; a save in progress has another name); of a sweep that grew, those of every part."""
        grown = self._grown()  # of shards, those started (a shard not started yet holds no step)
        steps = [p.checkpoint_steps() for p in grown]
        return parts.common(steps, self.shard_count() is not None) if grown else parts.steps_in(self.checkpoints_dir)

    def snapshot_steps(self) -> list[int]:
        """The steps of the complete snapshots (train/snapshots.py), ascending (every part's)."""
        grown = self._grown()
        steps = [p.snapshot_steps() for p in grown]
        return parts.common(steps, self.shard_count() is not None) if grown else parts.steps_in(self.snapshots_dir)

    def latest_step(self) -> int | None:
        """The step of the latest complete checkpoint, or None."""

        if self._grown():
            steps = self.checkpoint_steps()
            return steps[-1] if steps else None

        def load() -> int | None:
            if not self.has_checkpoints():
                return None
            checkpointer = self.checkpointer()
            try:
                return checkpointer.latest_step()
            finally:
                checkpointer.close()

        return self._cached("latest_step", self.checkpoints_dir, load)

    def member_states(self, step: int | None = None) -> dict:
        """{member name: its raw saved state (numpy: params, opt_state, step, diverged, ...)} of
        checkpoint ``step`` (default: the latest), or only ``params`` where ``step`` is a snapshot's
        and no checkpoint's, read without any model code."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise ConfigError(f"--workdir: {self.path} has no checkpoint yet; train it first")
        grown = self._grown()
        if grown:  # every part's members, each read from its own folder (a shard not started: none)
            views = [v for v in grown if v.checkpoint_steps() or v.snapshot_steps()]
            return {name: state for view in views for name, state in view.member_states(step).items()}
        snapshot = step not in self.checkpoint_steps() and step in self.snapshot_steps()
        folder = self.snapshots_dir if snapshot else self.checkpoints_dir

        def load() -> dict:
            from mhjax.io.checkpoint import member_key

            checkpointer = self.snapshotter() if snapshot else self.checkpointer()
            try:
                tree = checkpointer.restore_raw(step)
            finally:
                checkpointer.close()
            names = self.member_names() if os.path.isfile(self.results_path) else None
            members = tree["members"]
            if names is not None:
                members = {name: members[member_key(name)] for name in names if member_key(name) in members}
            return members

        return self._cached(("member_states", folder, step), os.path.join(folder, str(step)), load)

    def params(self, member: str, step: int | None = None):
        """``member``'s parameters (numpy tree) at checkpoint ``step`` (default: the latest)."""
        states = self.member_states(step)
        if member not in states:
            stopped = halved.stopped_state(self.path, member, self.latest_step() if step is None else step)
            if stopped is not None:  # halving stopped it at a rung: its state from then on
                return stopped["params"]
            raise ConfigError(
                f"--workdir: no member {member!r} at step {step} in {self.path} (have {', '.join(states)})"
            )
        return states[member]["params"]

    # ------------------------------------------------------------------ #
    # Writers
    # ------------------------------------------------------------------ #
    def window_sums(self, member: str):  # its per-window held-out sums (io/window_files.py), or None
        return window_files.read(self.file(window_files.FOLDER), member)

    def write_results(self, payload: dict, tables=None, summary=None) -> dict:
        """results.json, results.md and W/eval_windows (io/results_files.py); returns what they hold."""
        if self.order is None:  # the whole sweep: its one command holds the workdir
            return results_files.write(self, payload, tables, summary)
        with SharedWrite(self.path):  # parts that are shards write at once: each merges the other's
            return results_files.write(self, payload, tables, summary)

    def check_or_write_metadata(self, config_dict: dict, kind: str, *options) -> bool:
        """True if the workdir already belongs to this config (resume, or train longer), after
        writing mhjax.json if it is new (io/metadata.check_or_write: which configs may resume, and
        ``options``: extra, cannot_extend, defaults)."""
        return check_or_write(self, config_dict, kind, *options)

    def write_metadata(self, metadata: dict) -> None:
        """mhjax.json, atomically (never a half file)."""
        try:
            os.makedirs(self.path, exist_ok=True)
            write_json(self.metadata_path, metadata, sort_keys=True)
        except OSError as exc:
            raise ConfigError(
                f"--workdir: cannot write {self.metadata_path} ({type(exc).__name__}: {exc.strerror or exc})"
            ) from None
