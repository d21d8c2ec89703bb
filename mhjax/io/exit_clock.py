"""Callbacks run as late in the process's exit as Python allows: after every other atexit hook.

atexit runs its hooks last registered first, so the one hook here is registered when ``mhjax`` is
first imported (mhjax/__init__.py), before JAX and orbax register theirs: a callback then runs
after their teardown (backends, the distributed client, checkpoint threads), which a hook
registered during training would not see. For the stop-time record (train/preempt.py)."""

from __future__ import annotations

import atexit

_pending: list = []


def _run() -> None:
    for callback in _pending:
        try:
            callback()
        except Exception:  # a measurement: never an error at exit
            pass


atexit.register(_run)


def at_exit(callback) -> None:
    """Call ``callback()`` at the process's exit, after the other atexit hooks."""
    _pending.append(callback)


def cancel(callback) -> None:
    """Forget ``callback`` (idempotent)."""
    while callback in _pending:
        _pending.remove(callback)
