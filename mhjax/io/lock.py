"""One command per workdir: an exclusive lock on its lock file (io/workdir.py) for train, analyze and report.

Two commands writing one workdir delete each other's checkpoints and corrupt the one being
written, so a second command on a busy workdir stops with a one-line error naming the
holder's pid. The lock is a POSIX record lock (fcntl): the kernel drops it when its process
dies, so a workdir left by a killed run (kill -9 included) is taken over by the next command,
and the kernel reports the holder's pid, so the lock file stays empty and a refused command
changes nothing in the workdir.

Shards of one sweep (workflows/shards.py) train in one workdir at once: each holds its own
shard's lock for its whole run (``WorkdirLock(..., path=...)``) and takes ``SharedWrite`` (io/shared_write.py), a
short blocking lock on W/.mhjax.write.lock, around every write the shards share (results.json,
mhjax.json, trace/format.json). Both are POSIX locks: they hold on a local disk and on NFS with
its lock manager; a filesystem that refuses them (ENOLCK) is named in a one-line error.
"""

from __future__ import annotations

import fcntl
import os
import struct

from mhjax.config import ConfigError
from mhjax.io.shared_write import no_locks
from mhjax.io.workdir import Workdir


class WorkdirLock:
    """``create``: make the workdir if missing (train); else a missing workdir is left to the
    command's own error message (analyze, report) and nothing is locked."""

    def __init__(self, workdir, command: str, create: bool = False, path: str | None = None):
        """``path``: another lock file than the workdir's (a shard's, in its own folder)."""
        self.wd = Workdir.of(workdir)
        self.workdir, self.command, self.create, self.file = self.wd.path, command, create, None
        self.path = path or self.wd.lock_path

    def __enter__(self):
        if os.path.exists(self.workdir) and not os.path.isdir(self.workdir):
            raise ConfigError(f"--workdir: {self.workdir} exists and is not a folder")
        if not self.create and not os.path.isdir(self.workdir):
            return self
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            self.file = open(self.path, "a")
        except OSError as exc:
            raise ConfigError(
                f"--workdir: cannot use {self.workdir} ({type(exc).__name__}: {exc.strerror or exc})"
            ) from None
        try:
            fcntl.lockf(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            no_locks(exc, self.file, self.workdir)
            holder = _holder(self.file)
            self.file.close()
            raise ConfigError(
                f"--workdir: {self.workdir} is in use by another mhjax command (pid {holder}); "
                f"wait for it to finish or use another workdir (mhjax {self.command} not started)"
            ) from None
        return self

    def __exit__(self, *exc):
        if self.file is not None:
            fcntl.lockf(self.file, fcntl.LOCK_UN)
            self.file.close()


def holder_pid(workdir, path: str | None = None) -> int | None:
    """The pid of the process holding ``workdir``'s lock (``path``: another lock file, a shard's),
    or None (not held, or no lock file); reads only: the lock file is opened for reading, never created."""
    try:
        with open(path or Workdir.of(workdir).lock_path) as file:
            pid = _holder(file)
    except OSError:
        return None
    return int(pid) if pid.isdigit() else None


def _holder(file) -> str:
    """The pid holding a write lock on ``file`` (F_GETLK on a struct flock), or "unknown"."""
    query = struct.pack("hhqqi", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0)
    try:
        _, _, _, _, pid = struct.unpack("hhqqi", fcntl.fcntl(file, fcntl.F_GETLK, query))
    except OSError:
        return "unknown"
    return str(pid) if pid > 0 else "unknown"
