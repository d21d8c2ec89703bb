"""Stopping a training run on a signal: Ctrl-C (SIGINT) and a scheduler's notice (SIGTERM,
SIGUSR1, SIGUSR2: SLURM at its time limit or ``--signal=USR1@120``, a spot VM, Kubernetes).

The first signal asks the run to stop at its next consistent state: the end of the running
chunk (one compiled scan), where it writes a checkpoint (and any snapshot due) and flushes
TensorBoard, unless nothing was trained since the last one. A second signal exits at once, the
last complete checkpoint still the latest (checkpoints are written to a temporary folder and
renamed into place, io/checkpoint.py). A scheduler's signal during the restore or the compile
(``preparing``) exits at once too: nothing is trained yet, so nothing is lost.

Exit status: 130 (128 + SIGINT, what a shell reports) for Ctrl-C; ``EXIT_REQUEUE`` (75, BSD
sysexits' EX_TEMPFAIL: "temporary failure, try again") for a scheduler's signal, and for any
stop in which one took part. A dedicated code, not 143 (128 + SIGTERM): a launch script can
then tell "stopped cleanly, requeue me" from "killed" (143, 137), which may also mean a bug or
an operator's kill; launch/slurm.sbatch requeues on 75 alone (docs/cluster.md).

Under jax.distributed, JAX's preemption service owns SIGTERM (``own_sigterm=False``): the loop
asks it at every chunk end (train/preempt.py), and SIGUSR1/SIGUSR2 are shared between
processes through the loop's per-chunk gather.

Python runs signal handlers on the main thread only between bytecodes, so not while the
main thread waits inside XLA (a compile, a long chunk). The C-level handler also writes
the signal number to a wakeup file descriptor (``signal.set_wakeup_fd``): a small thread
reads it and acts at once, whatever the main thread is doing.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time

EXIT_STATUS = 130  # 128 + SIGINT, what a shell reports for a run stopped by Ctrl-C
EXIT_REQUEUE = 75  # EX_TEMPFAIL: stopped on a scheduler's signal, state saved; run the same command again
SCHEDULER_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


@contextlib.contextmanager
def exits_at_once(signals):
    """A block (a command, outside the training loop's StopOnSignal: before it starts, with the
    config, the experiment and the workdir; after it closes, with results and figures) in which
    each of ``signals`` exits at once with EXIT_REQUEUE: the checkpoints hold everything trained,
    and the command run again picks up from them, results included. The previous handling comes
    back after the block (nothing changes off the main thread)."""

    def handler(signum, frame):
        name = signal.Signals(signum).name
        sys.stderr.write(f"\nmhjax: {name} outside training: exiting now; the latest checkpoint holds the run\n")
        sys.stderr.flush()
        os._exit(EXIT_REQUEUE)

    previous = {}
    try:
        for signum in signals:
            previous[signum] = signal.signal(signum, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)


class Interrupted(Exception):
    """A stop signal arrived; a checkpoint was written (or nothing was trained since the last
    one). ``exit_status``: what the command exits with."""

    def __init__(self, message: str, exit_status: int = EXIT_STATUS):
        super().__init__(message)
        self.exit_status = exit_status


class StopOnSignal:
    """``start()`` ... ``close()`` (or a ``with`` block): ``raised`` turns True at the first
    signal. ``where`` says when the run will stop, as of now (the first message quotes it);
    ``preparing``: the run restores and compiles (a scheduler's signal exits at once).
    ``own_sigterm``: False under jax.distributed (JAX's preemption service takes SIGTERM)."""

    def __init__(self, where: str = "", stream=None, own_sigterm: bool = True):
        self.raised = False
        self.where = where
        self.preparing = True
        self.received: list[int] = []  # distinct signal numbers, the first first
        self.first_at: float | None = None  # time.time() of the first signal (the stop's measured time)
        self._count = 0  # signals the watcher thread saw
        self._stream = stream
        self._active = False
        self._signals = [signal.SIGINT] + [s for s in SCHEDULER_SIGNALS if own_sigterm or s != signal.SIGTERM]
        self._previous: dict = {}

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    @property
    def signal_name(self) -> str:
        """The first signal's name ("SIGTERM"), or "" before any."""
        return signal.Signals(self.received[0]).name if self.received else ""

    @property
    def exit_status(self) -> int:
        """130 for Ctrl-C alone; EXIT_REQUEUE once a scheduler's signal took part."""
        return EXIT_REQUEUE if any(s != signal.SIGINT for s in self.received) else EXIT_STATUS

    def note(self, signum: int) -> None:
        """Record ``signum`` (idempotent): from the handlers, or a stop asked for by another
        process (shared at a chunk end, train/preempt.py)."""
        if self.first_at is None:
            self.first_at = time.time()
        if int(signum) not in self.received:
            self.received.append(int(signum))
        self.raised = True

    def start(self) -> StopOnSignal:
        try:
            # The Python-level handler sets the flag in the main thread's own order of events (a
            # signal raised by the main thread is seen by its next statement); the watcher thread
            # below counts signals and speaks, whatever the main thread is doing.
            for signum in self._signals:
                self._previous[signum] = signal.signal(signum, self._handle)
        except ValueError:  # not the main thread: leave default handling
            return self
        self._reader, writer = socket.socketpair()
        writer.setblocking(False)
        self._writer = writer
        self._previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._active = True
        threading.Thread(target=self._watch, name="mhjax-signals", daemon=True).start()
        return self

    def _handle(self, signum, frame) -> None:
        self.note(signum)

    def _say(self, text: str) -> None:
        stream = self._stream or sys.stderr
        stream.write(f"\nmhjax: {text}\n")
        stream.flush()

    def _watch(self) -> None:
        while True:
            try:
                data = self._reader.recv(64)
            except OSError:
                return
            if not data:  # closed by close()
                return
            for signum in data:
                if signum in self._signals:
                    self._on_signal(signum)

    def _on_signal(self, signum: int) -> None:
        self._count += 1
        self.note(signum)
        name = "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name
        if self._count > 1:
            self._say(f"second signal ({name}): exiting now; the last complete checkpoint is the latest")
            os._exit(self.exit_status)  # at once: no cleanup may block on the running XLA computation
        if signum != signal.SIGINT and self.preparing:
            self._say(f"{name} during the restore or compile: exiting now (nothing trained yet, nothing lost)")
            os._exit(EXIT_REQUEUE)
        self._say(
            f"{name}: stopping once a checkpoint can be written"
            + (f" ({self.where})" if self.where else "")
            + "; a second signal exits at once (the last complete checkpoint stays the latest)"
        )

    def close(self) -> None:
        """Restore the previous signal handling (idempotent)."""
        if self._active:
            signal.set_wakeup_fd(self._previous_fd)
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)
            self._writer.close()
            self._reader.shutdown(socket.SHUT_RDWR)
            self._reader.close()
            self._active = False
