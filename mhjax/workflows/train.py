"""Training a sweep in its workdir (``mhjax train``, ``mhjax.sweep``) and describing one (--dry-run)."""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import time

import jax

from mhjax import __version__
from mhjax.config import ConfigError
from mhjax.data import tasks
from mhjax.io import metadata, plugin_log
from mhjax.io.lock import WorkdirLock
from mhjax.io.workdir import Workdir
from mhjax.train import halving, snapshots
from mhjax.train.loop import Sweep, run
from mhjax.workflows import growth


def describe(experiment, backend: str) -> str:
    """What a sweep will do, without compiling anything."""
    config = experiment.config
    header = f"experiment: {experiment.kind}, {len(experiment.members)} members, {config.train.steps} steps each"
    count, kinds = jax.device_count(), ", ".join(sorted({d.device_kind for d in jax.devices()}))
    cores = f", {os.cpu_count()} cores" if backend == "cpu" else ""
    machine = f"this machine: {backend}, {count} device{'s' * (count != 1)} ({kinds}{cores})"
    snapshot_steps = snapshots.steps_of(config)
    disk = [snapshots.disk_line(Sweep(experiment), snapshot_steps)] if snapshot_steps else []
    halved = halving.describe(experiment, backend)  # rungs, member-steps, the survivors' programs
    return "\n".join([header, machine] + experiment.notes() + experiment.plan(backend).lines() + halved + disk)


def default_workdir(config_path: str) -> str:
    """runs/<config name>-<timestamp>: where a sweep goes when no --workdir is given."""
    name = os.path.splitext(os.path.basename(config_path))[0]
    return os.path.join("runs", f"{name}-{time.strftime('%Y%m%d-%H%M%S')}")


class _QuietFileHandler(logging.FileHandler):
    def handleError(self, record):  # a full disk loses these logs, not the command's one-line error
        pass


@contextlib.contextmanager
def library_logs(path: str):
    """Python logging (absl, orbax) off the console: its warnings mean nothing to a user. Records
    are kept in memory and written to ``path`` when the command ends, except when it refused bad
    input (ConfigError), which leaves the workdir exactly as it was."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    for handler in saved[0]:
        root.removeHandler(handler)
    file = _QuietFileHandler(path, delay=True)  # the file appears with its first record
    file.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    memory = logging.handlers.MemoryHandler(capacity=1000, flushLevel=logging.CRITICAL + 1, target=file)
    root.addHandler(memory)
    root.setLevel(logging.WARNING)
    for record in plugin_log.held():  # JAX's plugin errors, kept off the console (io/plugin_log.py)
        memory.handle(record)
    try:
        yield
    except ConfigError:
        memory.buffer.clear()
        raise
    finally:
        root.removeHandler(memory)
        memory.close()  # flushes what is left into the file
        file.close()
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])


def check_sources(experiment, workdir: Workdir, allow_changed_task: bool, interface: str, log) -> None:
    """A workdir whose plug-in (task, mixture generator, phi, loss, step rule) has another source
    file now than the one its run recorded (sha256) is refused as analyze and forward refuse it,
    unless ``allow_changed_task``: then each is said, and mhjax.json's resume_history records the
    step from which the new source trains (io/metadata.check_or_write). A data file (the text
    corpus) that changed is refused whatever is allowed (io/metadata.check_data_files)."""
    if not os.path.isfile(workdir.metadata_path):
        return
    stored = workdir.metadata()
    if stored.get("mhjax_version") != __version__:
        return  # refused by check_or_write, in its words
    current = experiment.metadata()
    metadata.check_data_files(workdir, stored.get(metadata.DATA_FILES), current.get(metadata.DATA_FILES))
    lines = [
        f"{experiment.source_label(c['source'])}: its source {c['file']} changed since training (sha256 differs)"
        for c in metadata.source_changes(stored, current)
    ]
    if lines and not allow_changed_task:
        raise tasks.changed_error(lines, interface)
    for line in lines:
        log(f"{line}; training on under it (allowed): {Workdir.METADATA}'s {metadata.RESUME_HISTORY} says when")


def train(
    experiment,
    workdir,
    *,
    progress: bool = True,
    log=print,
    primary: bool = True,
    allow_changed_task: bool = False,
    interface: str = "python",
) -> dict:
    """Train (or resume) every member of ``experiment`` in ``workdir``; returns results.json's
    payload. ``primary``: this process holds the workdir's lock and its log (several processes of
    one distributed run share the workdir: process 0 does). A plug-in whose source changed since
    the workdir's run is refused unless ``allow_changed_task`` (``check_sources``; ``interface``:
    "cli" or "python", whose words the refusal uses)."""
    workdir = Workdir.of(workdir)
    shards = workdir.shard_count()
    if shards is not None:  # its shards train apart, each under its own lock (workflows/shards.py)
        raise ConfigError(f"--shard: {workdir.path} was started as {shards} shards; train each with --shard I/{shards}")
    lock = WorkdirLock(workdir, "train", create=True) if primary else contextlib.nullcontext()
    logs = library_logs(workdir.log_path) if primary else contextlib.nullcontext()
    with lock, logs:
        shards = workdir.shard_count()
        if shards is not None:  # its shards train apart, each under its own lock (workflows/shards.py)
            raise ConfigError(
                f"--shard: {workdir.path} was started as {shards} shards; train each with --shard I/{shards}"
            )
        if primary:  # before anything is written: growth.plan records a grown sweep
            check_sources(experiment, workdir, allow_changed_task, interface, log)
        experiment.keep_names(workdir.recorded_names())  # resumed or trained longer: the names it has
        for line in experiment.notes() if primary else ():
            log(line)
        parts = growth.plan(experiment, workdir, primary, log if primary else lambda _: None)
        if len(parts) == 1:
            return run(experiment, workdir, progress=progress, log=log)
        # a sweep that grew: each part not yet done trains alone; the last one at least, so the
        # command still says and returns the sweep's results
        payload = None
        for part in [p for p in parts if not growth.done(p)] or parts[-1:]:
            payload = run(part.experiment, part.workdir, progress=progress, log=log)
        return payload
