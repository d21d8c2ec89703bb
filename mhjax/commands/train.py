"""`mhjax train`: validate, describe (--dry-run) or train a sweep in its workdir."""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import os
import sys
import time

import jax

from mhjax.config import ConfigError, apply_overrides, load_config_file
from mhjax.experiments import make_experiment
from mhjax.io import compile_cache, plugin_log
from mhjax.io.lock import WorkdirLock
from mhjax.io.results import WriteFailed
from mhjax.io.workdir import Workdir
from mhjax.train.console import next_commands, summary_lines
from mhjax.train.interrupt import EXIT_STATUS
from mhjax.train.loop import Interrupted, run
from mhjax.train.placement import maybe_initialize_distributed


def load_config(path: str, overrides: dict):
    config = load_config_file(path)
    return apply_overrides(config, overrides) if overrides else config


def describe(experiment, backend: str) -> str:
    """What a sweep will do, without compiling anything."""
    config = experiment.config
    header = f"experiment: {experiment.kind}, {len(experiment.members)} members, {config.train.steps} steps each"
    count, kinds = jax.device_count(), ", ".join(sorted({d.device_kind for d in jax.devices()}))
    cores = f", {os.cpu_count()} cores" if backend == "cpu" else ""
    machine = f"this machine: {backend}, {count} device{'s' * (count != 1)} ({kinds}{cores})"
    return "\n".join([header, machine] + experiment.describe(backend))


def compile_for_target(args, config) -> int:
    """``--dry-run --target T``: plan the sweep for T and compile every executable for it."""
    from mhjax.train import deviceless, target

    if not args.dry_run:
        raise ConfigError("--target: only with --dry-run (it compiles for a device that is not here; nothing runs)")
    chosen = target.load(args.target)
    target.devices(chosen)  # a missing compiler: one line, before anything else
    experiment = make_experiment(config)
    print("\n".join(experiment.describe(chosen.backend)))
    report = deviceless.compile_for(experiment, chosen, log=lambda m: print(m, file=sys.stderr))
    print("\n".join(deviceless.lines(report, config.model.get("seq_len"))))
    return 0


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


def command(args, overrides) -> int:
    config = load_config(args.config, overrides)
    if args.target:
        return compile_for_target(args, config)
    if args.coordinator and (args.num_processes is None or args.process_id is None):
        raise ConfigError("--coordinator: needs --num-processes and --process-id")
    if args.num_processes is not None and not (
        args.num_processes >= 1 and 0 <= (args.process_id or 0) < args.num_processes
    ):
        raise ConfigError(
            f"--process-id: must be in [0, {args.num_processes}) with --num-processes {args.num_processes}"
        )
    if not args.dry_run:
        compile_cache.configure()  # before the first compile: a repeated or resumed sweep compiles nothing
        # Before make_experiment: validating a task runs it, which starts the XLA backend, and
        # jax.distributed.initialize must come before that.
        maybe_initialize_distributed(args.coordinator, args.num_processes, args.process_id, args.distributed)
    experiment = make_experiment(config)  # validates before anything compiles
    if args.dry_run:
        print(describe(experiment, jax.default_backend()))
        return 0
    workdir = Workdir(
        args.workdir
        or os.path.join(
            "runs", f"{os.path.splitext(os.path.basename(args.config))[0]}-{time.strftime('%Y%m%d-%H%M%S')}"
        )
    )
    # Several processes of one distributed run share the workdir: process 0 holds the lock and the log.
    primary = jax.process_index() == 0
    lock = WorkdirLock(workdir, "train", create=True) if primary else contextlib.nullcontext()
    logs = library_logs(workdir.log_path) if primary else contextlib.nullcontext()
    with lock, logs:
        try:
            payload = run(experiment, workdir, progress=not args.no_progress, log=lambda m: print(m, file=sys.stderr))
        except Interrupted as exc:
            print(f"mhjax: {exc}", file=sys.stderr)
            return EXIT_STATUS
        except WriteFailed as exc:  # a full disk: one line naming the file; the last checkpoint holds
            print(f"mhjax: error: {exc}", file=sys.stderr)
            return 1
    print(f"results: {workdir.results_path} ({len(payload['members'])} members)")
    table = summary_lines(experiment.summary_table(), payload["members"])
    if table:
        print(f"\nfinal results, mean over seeds (step {payload['steps']}):")
        print("\n".join(f"  {line}" for line in table))
    print("\nnext:")
    commands = next_commands(str(workdir), workdir.tensorboard_dir, experiment.analyzable)
    print("\n".join(f"  {line}" for line in commands))
    return 0
