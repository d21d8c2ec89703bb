"""One TensorBoard run per sweep member (W/tb/<member-name>: io/workdir.py), written without TensorFlow.

Names, numbers, text and images only (nothing of models or analysis). Each run holds, beside the loop's scalars:

* ``config`` (text): the resolved config, and the member's own hyperparameters;
* the HParams plugin's data, written straight as its protos (no TensorFlow): a session
  start (the member's swept fields: task, heads, seed, learning_rate, ...) when training
  starts; at the end the experiment (every hyperparameter with its discrete domain over the
  sweep, and every metric tag), final metric scalars ``final/<field>`` (every numeric
  results.json field that is not a hyperparameter) and the session end (status failure for
  a diverged member). Tags filled in later (e.g. ``analysis/...`` by ``mhjax analyze``) are
  listed as metrics too, so head counts can be compared, sorted and filtered in one table;
* images the experiment draws at the end of training (e.g. attention heatmaps).

The HParams protos are io/hparams.py's; a failing disk is kept from the training by io/event_guard.py.
"""

from __future__ import annotations

import json
import os
import sys
import time

from tensorboardX import SummaryWriter

from mhjax.io.event_guard import drain, guard
from mhjax.io.hparams import (
    add_summary,
    experiment_summary,
    final_metrics,
    session_end_summary,
    session_start_summary,
    uniform_types,
)


class MemberWriters:
    purged = False  # whether a resume dropped the points of earlier runs (set per instance)

    def __init__(self, root: str, names: list[str], log=None, purge_step: int | None = None):
        """``root``: the folder of the runs (``Workdir.tensorboard_dir``). A run that cannot be
        written (a full disk) loses its events from then on, says so once through ``log`` and
        never stops the training: TensorBoard is a view of it, not its record.
        ``purge_step``: a run resumed from that step's checkpoint; readers (TensorBoard, io/curves.py)
        drop every point at steps >= it written before, by a process that trained past the
        checkpoint and was killed (tensorboardX's purge_step: a SessionLog START at that step).
        Only runs that already hold events get it."""
        self.root = root
        self.log = log or (lambda message: print(message, file=sys.stderr))
        self.lost: dict[str, str] = {}  # member -> why its events are no longer written
        self.purged = purge_step is not None and any(has_events(os.path.join(root, name)) for name in names)
        self.writers = {name: self._open(name, purge_step) for name in names}

    def _open(self, name: str, purge_step: int | None = None) -> SummaryWriter:
        path = os.path.join(self.root, name)
        if not has_events(path):
            purge_step = None
        try:
            # named to the ns: a resume within the second of the last run must not write over its file
            writer = SummaryWriter(
                path, flush_secs=30, purge_step=purge_step, filename_suffix=f".{time.time_ns():020d}"
            )
        except OSError as exc:
            self._lose(name, exc)
            return SummaryWriter(path, write_to_disk=False)  # the same methods, writing nothing
        guard(writer, lambda exc: self._lose(name, exc))
        return writer

    def _lose(self, name: str, exc: BaseException) -> None:
        if name not in self.lost:
            self.lost[name] = f"{type(exc).__name__}: {exc}"
            self.log(
                f"tensorboard: events of {name} are lost from here on ({self.lost[name]}); "
                "training goes on, checkpoints and results are not affected"
            )

    def scalars(self, name: str, values: dict, step: int) -> None:
        writer = self.writers[name]
        for tag, value in values.items():
            writer.add_scalar(tag, float(value), step)

    def text(self, name: str, tag: str, text: str, step: int) -> None:
        self.writers[name].add_text(tag, text, step)

    def images(self, name: str, images: dict, step: int) -> None:
        """``images``: {tag: RGB uint8 array (H, W, 3)}."""
        for tag, image in images.items():
            self.writers[name].add_image(tag, image, step, dataformats="HWC")

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()

    def flush(self) -> None:
        """Every event logged so far on disk (the loop calls this before a checkpoint is committed,
        so a kill -9 after it loses no point up to the checkpoint's step). tensorboardX's own flush
        writes out only what its thread has taken from the queue: wait for the thread first."""
        for writer in self.writers.values():
            drain(writer)
            writer.flush()

    # ------------------------------------------------------------------ #
    # Start and end of a training run
    # ------------------------------------------------------------------ #
    def start(self, config: dict, hparams: dict[str, dict], step: int = 0) -> None:
        """Config text and the HParams session start of every member; ``hparams``: {member: swept fields}."""
        text = config_markdown(config)
        now = time.time()
        hparams = uniform_types(hparams)
        for name, values in hparams.items():
            writer = self.writers[name]
            writer.add_text("config", text + "\n\n" + _hparams_markdown(values), step)
            add_summary(writer, session_start_summary(values, group_name=name, start_time_secs=now), step)
        self.flush()

    def finish(
        self,
        records: list[dict],
        hparams: dict[str, dict],
        later_tags: list[str],
        step: int,
        description: str = "",
        again: bool = False,
    ) -> None:
        """Final metric scalars, the HParams experiment and every member's session end.
        ``records``: results.json members; ``later_tags``: metric tags logged after training.
        ``again``: a run that trained nothing (the sweep already at its last step, not purged): a
        member whose run already holds its final/ scalars at ``step`` does not get them twice
        (one killed before writing them does)."""
        by_name = {r["name"]: r for r in records}
        hparams = uniform_types(hparams)
        swept = set(next(iter(hparams.values()), {}))
        metrics = final_metrics(records, swept)
        experiment_pb = experiment_summary(hparams, [f"final/{k}" for k in metrics] + list(later_tags), description)
        for name in hparams:
            writer = self.writers[name]
            record = by_name.get(name, {})
            written = again and _has_final(os.path.join(self.root, name), [f"final/{k}" for k in metrics], step)
            for key in metrics if not written else ():
                value = record.get(key)
                writer.add_scalar(f"final/{key}", float("nan") if value is None else float(value), step)
            add_summary(writer, experiment_pb, step)
            add_summary(
                writer, session_end_summary("failure" if record.get("status") == "diverged" else "success"), step
            )
        self.flush()


class NoWriters:
    """MemberWriters' stand-in where nothing is written (the non-primary processes of a
    distributed run): the same methods, each doing nothing."""

    purged = False

    def scalars(self, name: str, values: dict, step: int) -> None:
        pass

    def text(self, name: str, tag: str, text: str, step: int) -> None:
        pass

    def images(self, name: str, images: dict, step: int) -> None:
        pass

    def close(self) -> None:
        pass

    def flush(self) -> None:
        pass

    def start(self, config: dict, hparams: dict[str, dict], step: int = 0) -> None:
        pass

    def finish(self, records, hparams, later_tags, step: int, description: str = "", again: bool = False) -> None:
        pass


def _has_final(run_dir: str, tags: list[str], step: int) -> bool:
    """Whether the run at ``run_dir`` holds every one of ``tags`` at ``step`` (on disk)."""
    if not has_events(run_dir):
        return False
    from mhjax.io.curves import read_run  # tensorboard's reader imports slowly: only for a run again

    scalars = read_run(run_dir)
    return all(tag in scalars and step in scalars[tag][0] for tag in tags)


def has_events(run_dir: str) -> bool:
    """Whether the run folder holds an event file."""
    return os.path.isdir(run_dir) and any("tfevents" in entry for entry in os.listdir(run_dir))


def log_to_run(run_dir: str, scalars: dict, images: dict, step: int) -> None:
    """Append scalars and images ({tag: RGB uint8 (H, W, 3)}) to the run at ``run_dir`` (``Workdir.run_dir``).
    Each call writes an event file of its own, named in the order of the calls (readers read files
    by name): calls within one second (an analysis at several steps) do not write over each other's."""
    writer = SummaryWriter(run_dir, flush_secs=30, filename_suffix=f".{time.time_ns():020d}")
    try:
        for tag, value in scalars.items():
            writer.add_scalar(tag, float(value), step)
        for tag, image in images.items():
            writer.add_image(tag, image, step, dataformats="HWC")
    finally:
        writer.close()


# ---------------------------------------------------------------------- #
# Text
# ---------------------------------------------------------------------- #
def config_markdown(config: dict) -> str:
    body = json.dumps(config, indent=2, default=str)
    return "Resolved config:\n\n```json\n" + body + "\n```"


def _hparams_markdown(hparams: dict) -> str:
    return "This member: " + ", ".join(f"`{k}={v}`" for k, v in hparams.items())
