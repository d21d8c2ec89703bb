"""A process of a jax.distributed run that is lost (kill -9, a node that dies): the survivors exit
at once with the requeue code and one line, their last checkpoint intact.

Two ways a survivor learns of it. A collective with the lost process fails (Gloo on CPU: "UNKNOWN:
Gloo AllGather failed ... Connection closed by peer", half a second after the kill): the host loop
catches it (``lost``, ``exit_requeue``). Or a collective hangs (NCCL may wait on a dead peer): the
coordination service misses the process's heartbeats for ``HEARTBEAT_S`` and tells every other
process, which JAX's client answers by aborting (SIGABRT and a C++ stack, rc -6); mhjax gives the
client a callback that says one line and exits with the requeue code instead.

Either way the survivor leaves with ``os._exit``: Python's own exit would run the loop's
``finally`` (a barrier with every process) and JAX's atexit shutdown (another barrier), each of
which waits for the dead process until the heartbeat timeout and then aborts. Nothing of the run
is lost by skipping them: checkpoints are written to a temporary folder and renamed into place
(io/checkpoint.py), so the latest complete one stays the latest, and the resumed run drops the
TensorBoard points after it (its purge_step, docs/cluster.md).
"""

from __future__ import annotations

import os
import re
import sys

import jax

from mhjax.train.interrupt import EXIT_REQUEUE

# Seconds without a heartbeat before the coordination service declares a process lost (JAX's
# default is 100; a survivor then waited ~95 s before aborting). Heartbeats come from a thread of
# their own, so a long compile or chunk does not delay them.
HEARTBEAT_S = 10

# The status codes a failed collective or coordination call carries in its message ("UNKNOWN:
# Gloo AllGather failed ...", "UNAVAILABLE: ...", "DEADLINE_EXCEEDED: ..."): the runtime's, not a
# bug in mhjax (a TypeError, a shape mismatch), which keeps its traceback.
_RUNTIME_STATUS = re.compile(r"^(UNKNOWN|UNAVAILABLE|INTERNAL|DEADLINE_EXCEEDED|ABORTED|CANCELLED): ")


def initialize(coordinator: str | None, num_processes: int | None, process_id: int | None) -> None:
    """jax.distributed.initialize (explicit or auto-detected) with a heartbeat timeout of ``HEARTBEAT_S``."""
    jax.distributed.initialize(
        coordinator_address=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        heartbeat_timeout_seconds=HEARTBEAT_S,
    )


def lost(exc: BaseException) -> bool:
    """Whether ``exc``, raised in a run of several processes, is a collective or coordination
    failure (a lost process) rather than a bug."""
    text = str(exc).lstrip()
    return jax.process_count() > 1 and isinstance(exc, (ValueError, RuntimeError)) and bool(_RUNTIME_STATUS.match(text))


def exit_requeue(exc: BaseException, checkpoints_dir: str, resume: str) -> None:
    """One line and the requeue code, now (never returns)."""
    first = str(exc).strip().splitlines()[0][:200]
    steps = [int(d) for d in _listdir(checkpoints_dir) if d.isdigit()]
    held = f"the latest checkpoint (step {max(steps)}) holds the run" if steps else "no checkpoint yet"
    _leave(f"another process of this run is gone ({first}); exiting with the requeue code; {held}; resume: {resume}")


def _leave(line: str) -> None:
    try:
        sys.stdout.flush()
        sys.stderr.write(f"\nmhjax: {line}\n")
        sys.stderr.flush()
    finally:
        os._exit(EXIT_REQUEUE)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []
