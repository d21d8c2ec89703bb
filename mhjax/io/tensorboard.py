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
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np
from tensorboardX import SummaryWriter

from mhjax.io.results import OLD_NAMES

# Fields of a results.json record that are not metrics.
_NOT_METRICS = {
    "name",
    "program",
    "status",
    "steps",
    "params",
    "diverged_at_step",
    "loss_exceeded_at_step",
    "nonfinite_at_step",
    *OLD_NAMES,
}


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
        _guard(writer, lambda exc: self._lose(name, exc))
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
            guard = getattr(writer, "_mhjax_guard", None)
            if guard is not None:
                guard.drain(writer._get_file_writer().event_writer)
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
            _add_summary(writer, session_start_summary(values, group_name=name, start_time_secs=now), step)
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
            _add_summary(writer, experiment_pb, step)
            _add_summary(
                writer, session_end_summary("failure" if record.get("status") == "diverged" else "success"), step
            )
        self.flush()


class _GuardedEvents:
    """A run's event file whose failing write (a full disk) reports once and drops the run's
    later events. Unguarded, tensorboardX's writer thread dies with a traceback, and its queue,
    no longer emptied, blocks the training loop once full; a failed flush raises in the loop."""

    def __init__(self, events, on_error):
        self.events, self.on_error, self.failed = events, on_error, False
        self._reached = threading.Condition()
        self._marks = [0, 0]  # marks sent, marks the writer thread reached

    def _guarded(self, write) -> None:
        if self.failed:
            return
        try:
            write()
        except OSError as exc:
            self.failed = True
            self.on_error(exc)

    def write_event(self, event) -> None:
        if isinstance(event, _Mark):  # every event queued before it is written
            with self._reached:
                self._marks[1] = max(self._marks[1], event.number)
                self._reached.notify_all()
            return
        self._guarded(lambda: self.events.write_event(event))

    def drain(self, event_writer, timeout: float = 60.0) -> None:
        """Wait until ``event_writer``'s thread has written every event queued so far."""
        if event_writer._closed:
            return
        with self._reached:
            self._marks[0] += 1
            number = self._marks[0]
        event_writer._event_queue.put(_Mark(number))
        with self._reached:
            self._reached.wait_for(lambda: self._marks[1] >= number, timeout)

    def flush(self) -> None:
        self._guarded(self.events.flush)

    def close(self) -> None:
        self._guarded(self.events.close)


class _Mark:
    """Queued behind a run's events (it crosses tensorboardX's multiprocessing queue pickled, so
    it is known by its number): reached, everything before it is written (_GuardedEvents.drain)."""

    def __init__(self, number: int):
        self.number = number


def _guard(writer: SummaryWriter, on_error) -> None:
    """Route every write of ``writer``'s event file, from its thread and from ours, through
    _GuardedEvents (tensorboardX 2.x: FileWriter.event_writer is the EventFileWriter whose
    ``_ev_writer`` the caller and whose ``_worker._record_writer`` the thread write to)."""
    events = writer._get_file_writer().event_writer
    guarded = _GuardedEvents(events._ev_writer, on_error)
    events._ev_writer = guarded
    events._worker._record_writer = guarded
    writer._mhjax_guard = guarded


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


# ---------------------------------------------------------------------- #
# HParams plugin protos (the same bytes tensorboard.plugins.hparams.summary_v2 writes)
# ---------------------------------------------------------------------- #
def _add_summary(writer: SummaryWriter, summary, step: int) -> None:
    from tensorboardX.proto.summary_pb2 import Summary

    writer._get_file_writer().add_summary(Summary.FromString(summary.SerializeToString()), step)


def _summary(tag: str, plugin_data):
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.hparams import metadata

    summary = summary_pb2.Summary()
    summary.value.add(tag=tag, metadata=metadata.create_summary_metadata(plugin_data), tensor=metadata.NULL_TENSOR)
    return summary


def _hparam_value(value):
    """(DataType name, setter) of a hyperparameter value."""
    if isinstance(value, (bool, np.bool_)):
        return "DATA_TYPE_BOOL", lambda v, x: setattr(v, "bool_value", bool(x))
    if isinstance(value, (int, float, np.integer, np.floating)):
        return "DATA_TYPE_FLOAT64", lambda v, x: setattr(v, "number_value", float(x))
    return "DATA_TYPE_STRING", lambda v, x: setattr(v, "string_value", str(x))


def uniform_types(hparams: dict[str, dict]) -> dict[str, dict]:
    """{member: fields} with a field whose values differ in type across members (head_dim None
    and 16: "None" and 16) written as text in every member, so its HParams domain has one type."""
    kinds: dict[str, set] = {}
    for values in hparams.values():
        for name, value in values.items():
            kinds.setdefault(name, set()).add(_hparam_value(value)[0])
    mixed = {name for name, k in kinds.items() if len(k) > 1}
    return {m: {k: str(v) if k in mixed else v for k, v in values.items()} for m, values in hparams.items()}


def session_start_summary(hparams: dict, group_name: str = "", start_time_secs: float | None = None):
    from tensorboard.plugins.hparams import plugin_data_pb2

    info = plugin_data_pb2.SessionStartInfo(group_name=group_name, start_time_secs=start_time_secs or time.time())
    for name, value in hparams.items():
        _, setter = _hparam_value(value)
        setter(info.hparams[name], value)
    from tensorboard.plugins.hparams import metadata

    return _summary(metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=info))


def session_end_summary(status: str = "success", end_time_secs: float | None = None):
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    info = plugin_data_pb2.SessionEndInfo(
        status=api_pb2.Status.Value(f"STATUS_{status.upper()}"), end_time_secs=end_time_secs or time.time()
    )
    return _summary(metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=info))


def experiment_summary(hparams: dict[str, dict], metric_tags: list[str], description: str = ""):
    """Every swept field with its discrete domain over the sweep, and the metric tags;
    ``hparams``: {member: its swept fields}."""
    from google.protobuf import struct_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    domains: dict[str, list] = {}
    for values in hparams.values():
        for name, value in values.items():
            if value not in domains.setdefault(name, []):
                domains[name].append(value)
    infos = []
    for name, values in domains.items():
        kind, setter = _hparam_value(values[0])
        domain = struct_pb2.ListValue()
        for value in sorted(values) if kind != "DATA_TYPE_STRING" else values:
            setter(domain.values.add(), value)
        infos.append(
            api_pb2.HParamInfo(
                name=name,
                display_name=name,
                type=api_pb2.DataType.Value(kind),
                domain_discrete=domain,
                differs=len(values) > 1,
            )
        )
    metric_infos = [
        api_pb2.MetricInfo(
            name=api_pb2.MetricName(tag=tag),
            display_name=tag,
            dataset_type=api_pb2.DATASET_VALIDATION
            if "eval" in tag or tag.startswith("analysis/")
            else api_pb2.DATASET_TRAINING,
        )
        for tag in dict.fromkeys(metric_tags)
    ]
    exp = api_pb2.Experiment(
        description=description, time_created_secs=time.time(), hparam_infos=infos, metric_infos=metric_infos
    )
    return _summary(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=exp))


def final_metrics(records: list[dict], swept: set[str]) -> list[str]:
    """Numeric fields of the results records that are metrics (not the ``swept`` hyperparameters), in order."""
    keys: dict[str, None] = {}
    for record in records:
        for key, value in record.items():
            if key in _NOT_METRICS or key in swept or isinstance(value, bool):
                continue
            if isinstance(value, (int, float, np.integer, np.floating)) or (value is None and key in keys):
                keys[key] = None
    return list(keys)
