"""What the host loop does about a stop signal (train/interrupt.py) at its chunk ends: how long a
graceful stop takes, whether every process stops at this chunk, and the line said at the stop.

A chunk is one compiled scan: a signal waits for its end, then TensorBoard is flushed and the
checkpoint written, then the files are closed and the process exits. The time from a signal to the
exit is therefore at most the longest chunk plus one flush and checkpoint write plus the close and
exit (``StopTimes``: the first two measured as the run goes, the last measured at the previous stop
and kept in W/stop.json, ``MeasuredStop``), which must fit in the scheduler's grace between its
signal and its SIGKILL: ``train.preempt_grace_s`` (default 30 s, SLURM's KillWait). chunk_steps
cannot change on resume, so a run that would not fit says so, naming a chunk_steps that does,
at its first chunk (before its first checkpoint).

Several processes (jax.distributed) must stop at the same chunk, or the checkpoint, a
collective, never completes (``SharedStop``): SIGTERM is left to JAX's preemption service,
asked with a chunk counter 0, 1, 2, ... (``reached_preemption_sync_point`` needs consecutive
ids); SIGUSR1/SIGUSR2 (and SIGTERM where JAX's service is off) travel as each process's flag
in the gather the loop does at every chunk end anyway.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import sys
import time

import jax
import numpy as np
from jax.experimental import multihost_utils

from mhjax.config import ConfigError
from mhjax.io import exit_clock
from mhjax.io.results import write_json
from mhjax.train.interrupt import EXIT_STATUS, SCHEDULER_SIGNALS, Interrupted

GRACE_FIELD = "train.preempt_grace_s"
DEFAULT_GRACE_S = 30.0  # SLURM's default KillWait: SIGTERM, then SIGKILL 30 s later


def grace_seconds(config) -> float:
    """``train.preempt_grace_s`` (default 30); a one-line ConfigError unless a number > 0."""
    value = config.train.get("preempt_grace_s", DEFAULT_GRACE_S)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value > 0):
        raise ConfigError(f"config.{GRACE_FIELD}: must be a number of seconds > 0, got {value!r}")
    return float(value)


class StopTimes:
    """The longest chunk (scaled to ``chunk_steps`` steps), the slowest TensorBoard flush and
    checkpoint write seen so far, and the close and exit of the previous stop, and the warning when
    their sum exceeds ``grace`` seconds (said once)."""

    def __init__(
        self, grace: float, chunk_steps: int, step_seconds: float | None = None, last_stop: dict | None = None
    ):
        """``step_seconds``: a prior per-step time (a resumed run's mean so far), else None;
        ``last_stop``: the previous stop's record (``MeasuredStop.read``): its flush and checkpoint
        write, and its time from the stop line to the exit, count until measured again."""
        self.grace, self.chunk_steps = float(grace), int(chunk_steps)
        self.chunk_s = step_seconds * self.chunk_steps if step_seconds else None
        self.save_s: float | None = (last_stop or {}).get("save_s")
        self.exit_s: float | None = (last_stop or {}).get("exit_s")
        self.warned = False

    def chunk(self, seconds: float, steps: int, log=None) -> None:
        """A chunk of ``steps`` steps took ``seconds``; the warning, if now due, said on ``log``."""
        scaled = float(seconds) * self.chunk_steps / max(int(steps), 1)
        self.chunk_s = scaled if self.chunk_s is None else max(self.chunk_s, scaled)
        self._warn(log)

    def saved(self, seconds: float, log=None) -> None:
        """A TensorBoard flush and checkpoint write took ``seconds``."""
        self.save_s = float(seconds) if self.save_s is None else max(self.save_s, float(seconds))
        self._warn(log)

    def _warn(self, log) -> None:
        line = self.warning() if log is not None else None
        if line:
            log(line)

    @property
    def predicted(self) -> float | None:
        """Seconds from a signal to the exit, as far as measured (None before any chunk)."""
        return None if self.chunk_s is None else self.chunk_s + (self.save_s or 0.0) + (self.exit_s or 0.0)

    def start_line(self) -> str:
        head = "graceful stop on SIGTERM/SIGUSR1/SIGUSR2: at the running chunk's end, then a checkpoint"
        grace = f"{GRACE_FIELD}={self.grace:g}"
        if self.predicted is None:
            return f"{head}; its time is measured from the first chunk (against {grace})"
        return f"{head}: ~{self.predicted:.1f} s ({self._parts()}) against {grace}"

    def _parts(self) -> str:
        write = "flush and checkpoint write"
        save = f"{write} not yet measured" if self.save_s is None else f"{write} {self.save_s:.1f} s"
        close = "close and exit not yet measured" if self.exit_s is None else f"close and exit {self.exit_s:.1f} s"
        return f"chunk of {self.chunk_steps} steps {self.chunk_s:.1f} s + {save} + {close}"

    def suggested_chunk_steps(self) -> int | None:
        """The largest chunk_steps whose chunk plus checkpoint write fit in the grace (None: none does)."""
        room = self.grace - (self.save_s or 0.0) - (self.exit_s or 0.0)
        per_step = (self.chunk_s or 0.0) / self.chunk_steps
        if room <= 0 or per_step <= 0:
            return None
        return max(1, min(self.chunk_steps, int(room / per_step)))

    def warning(self) -> str | None:
        """The one warning line when the predicted stop exceeds the grace (None: fits or said already)."""
        if self.warned or self.predicted is None or self.predicted <= self.grace:
            return None
        self.warned = True
        took = f"~{self.predicted:.1f} s ({self._parts()})"
        line = f"warning: a graceful stop would take {took}, over {GRACE_FIELD}={self.grace:g}"
        fits = self.suggested_chunk_steps()
        if fits is None or fits >= self.chunk_steps:
            return line + "; the checkpoint write and exit alone do not fit: ask for more grace (--signal=USR1@120)"
        return (
            line + f"; chunk_steps={fits} fits, and cannot change on resume: "
            f"start again in a new workdir with --config.train.chunk_steps={fits}, or ask the scheduler for more grace"
        )


STOP_FILE = "stop.json"  # beside progress.json: the last graceful stop's measured times


def stop_path(workdir) -> str:
    """W/stop.json of ``workdir`` (a Workdir or a part's view): beside its checkpoints, as progress.json."""
    return os.path.join(os.path.dirname(workdir.checkpoints_dir), STOP_FILE)


class MeasuredStop:
    """A graceful stop's times, in W/stop.json (``path``) for the next run's prediction and line:
    {"signal", "step", "signal_at", "stopped_at", "predicted_s", "save_s", "exited_at"}, times as
    time.time(), ``save_s`` the slowest flush and checkpoint write of the stopped run.
    ``exited_at`` is written by the last atexit hook (io/exit_clock.py), so it counts closing the
    files and the exit but Python's final teardown of modules (tens of milliseconds)."""

    def __init__(self, path: str, stop, step: int, times: StopTimes):
        self.path = path
        now = time.time()
        self.payload = {
            "signal": stop.signal_name,
            "step": int(step),
            "signal_at": stop.first_at or now,
            "stopped_at": now,
            "predicted_s": times.predicted,
            "save_s": times.save_s,
            "exited_at": None,
        }
        self._write()
        exit_clock.at_exit(self._exited)  # after JAX's own exit hooks: their time counts

    def _exited(self) -> None:
        self.payload["exited_at"] = time.time()
        self._write()

    def _write(self) -> None:
        try:
            write_json(self.path, self.payload)
        except OSError:  # a measurement: a full disk must not turn a clean stop into a crash
            pass

    @staticmethod
    def read(path: str) -> dict | None:
        """The last stop's record, with ``exit_s`` (stop line to exit) and ``total_s`` (signal to
        exit) where it was measured to the end; None without one."""
        try:
            with open(path) as f:
                record = json.load(f)
            exited, stopped, signalled = record.get("exited_at"), record["stopped_at"], record["signal_at"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not isinstance(exited, (int, float)) or not isinstance(record.get("save_s"), (int, float, type(None))):
            return None
        return {**record, "exit_s": max(0.0, exited - stopped), "total_s": max(0.0, exited - signalled)}

    @staticmethod
    def line(record: dict) -> str:
        """What the resumed run says of the last stop: measured against predicted."""
        predicted = record.get("predicted_s")
        against = f", predicted ~{predicted:.1f} s" if isinstance(predicted, (int, float)) else ""
        return (
            f"last stop ({record.get('signal') or 'signal'} at step {record.get('step')}): "
            f"{record['total_s']:.1f} s from the signal to the exit ({record['exit_s']:.1f} s of it closing "
            f"and exiting after the checkpoint){against}"
        )


class SharedStop:
    """Whether to stop at this chunk end, the same answer on every process."""

    def __init__(self, stop):
        self.stop = stop
        self.processes = jax.process_count()
        self.counter = 0  # chunk ends so far: JAX's preemption sync needs consecutive ids
        self.jax_sigterm = self.processes > 1 and jax_preemption_service()

    def flag(self) -> np.ndarray:
        """This process's stop flag for the chunk-end gather: the first signal's number, or 0."""
        return np.array([self.stop.received[0] if self.stop.raised and self.stop.received else 0], np.int32)

    def now(self, flags) -> bool:
        """After a chunk: stop here? ``flags``: the gathered flags of every process (this one's
        alone with one process, where the signal handler's own flag decides)."""
        counter, self.counter = self.counter, self.counter + 1
        if self.processes == 1:
            return self.stop.raised
        flags = [int(f) for f in np.asarray(flags).ravel() if f]
        for signum in flags:
            self.stop.note(signum)
        if self.jax_sigterm and multihost_utils.reached_preemption_sync_point(counter):
            self.stop.note(signal.SIGTERM)
            return True
        return bool(flags)


def owned_signals() -> tuple:
    """The scheduler's signals mhjax handles here: all of them, less SIGTERM where JAX's preemption
    service owns it (jax.distributed)."""
    jax_owns = jax.process_count() > 1 and jax_preemption_service()
    return tuple(s for s in SCHEDULER_SIGNALS if not (jax_owns and s == signal.SIGTERM))


def jax_preemption_service() -> bool:
    """Whether jax.distributed runs JAX's preemption service (it then owns SIGTERM)."""
    from jax._src import distributed

    return distributed.global_state.client is not None and distributed.global_state.preemption_sync_manager is not None


# Values that belong to this launch, not the next: a coordinator's port is free now, not then.
_PER_LAUNCH = {"--coordinator": "HOST:PORT", "--process-id": "I"}


def resume_command(workdir: str) -> str:
    """The command that resumes: this ``mhjax train`` command line with ``--workdir`` spelled out
    (a default workdir is new on every call) and the coordinator's address and process id as
    placeholders (``--coordinator HOST:PORT``, ``--process-id I``: the next launch's, on every
    process); outside the command line, words saying so."""
    argv = sys.argv[1:]
    if argv[:1] != ["train"]:
        return f"train again with workdir {workdir}"
    args, skip = [], None
    for arg in argv[1:]:
        name = arg.split("=", 1)[0]
        if skip is not None:
            args += [] if skip == "--workdir" else [_PER_LAUNCH[skip]]
            skip = None
        elif arg in ("--workdir", *_PER_LAUNCH):
            skip = arg
            args += [] if arg == "--workdir" else [arg]
        elif name in _PER_LAUNCH:
            args.append(f"{name}={_PER_LAUNCH[name]}")
        elif name != "--workdir":
            args.append(arg)
    return shlex.join(["mhjax", "train", *args, "--workdir", os.fspath(workdir)])


def interrupted(stop, step: int, workdir: str, saved: bool) -> Interrupted:
    """The exception that ends a run stopped by ``stop`` at ``step``, with its one line."""
    what = "checkpoint written" if saved else "nothing new to save"
    if stop.exit_status == EXIT_STATUS:  # Ctrl-C: the user is at the terminal
        where = f"at step {step}" + ("" if saved else " before training")
        return Interrupted(f"interrupted {where}; {what}, run the same command to resume", EXIT_STATUS)
    line = f"{stop.signal_name or 'signal'}: stopped at step {step}, {what}; resume: {resume_command(workdir)}"
    return Interrupted(line, stop.exit_status)
