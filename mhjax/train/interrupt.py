"""Ctrl-C during training: the first SIGINT asks the run to stop at its next consistent
state (it writes a checkpoint there, unless nothing was trained since the last one); a
second exits at once with status 130, the last complete checkpoint still the latest
(checkpoints are written to a temporary folder and renamed into place, io/checkpoint.py).

Python runs signal handlers on the main thread only between bytecodes, so not while the
main thread waits inside XLA (a compile, a long chunk). The C-level handler also writes
the signal number to a wakeup file descriptor (``signal.set_wakeup_fd``): a small thread
reads it and acts at once, whatever the main thread is doing.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading

EXIT_STATUS = 130  # 128 + SIGINT, what a shell reports for a run stopped by Ctrl-C


class StopOnSignal:
    """``start()`` ... ``close()`` (or a ``with`` block): ``raised`` turns True at the first
    SIGINT. ``where`` says when the run will stop, as of now (the first message quotes it)."""

    def __init__(self, where: str = "", stream=None):
        self.raised = False
        self.where = where
        self._presses = 0
        self._stream = stream
        self._active = False

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.close()

    def start(self) -> StopOnSignal:
        try:
            # The Python-level handler sets the flag in the main thread's own order of events (a
            # signal raised by the main thread is seen by its next statement); the watcher thread
            # below counts presses and speaks, whatever the main thread is doing.
            self._previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: leave default handling
            return self
        self._reader, writer = socket.socketpair()
        writer.setblocking(False)
        self._writer = writer
        self._previous_fd = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._active = True
        threading.Thread(target=self._watch, name="mhjax-sigint", daemon=True).start()
        return self

    def _handle(self, signum, frame) -> None:
        self.raised = True

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
            if not data:  # closed by __exit__
                return
            for signum in data:
                if signum == signal.SIGINT:
                    self._on_sigint()

    def _on_sigint(self) -> None:
        self._presses += 1
        self.raised = True
        if self._presses == 1:
            self._say(
                "Ctrl-C: stopping once a checkpoint can be written"
                + (f" ({self.where})" if self.where else "")
                + "; press Ctrl-C again to exit at once (the last complete checkpoint stays the latest)"
            )
            return
        self._say("second Ctrl-C: exiting now; the last complete checkpoint is the latest")
        os._exit(EXIT_STATUS)  # at once: no cleanup may block on the running XLA computation

    def close(self) -> None:
        """Restore the previous SIGINT handling (idempotent)."""
        if self._active:
            signal.set_wakeup_fd(self._previous_fd)
            signal.signal(signal.SIGINT, self._previous)
            self._writer.close()
            self._reader.shutdown(socket.SHUT_RDWR)
            self._reader.close()
            self._active = False
