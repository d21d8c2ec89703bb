"""A short lock around a write that shards of one sweep share (results.json, mhjax.json's
sweep_history, trace/format.json): W/.mhjax.write.lock, a POSIX record lock taken blocking, so a
shard waits the moment another one writes and neither loses the other's entries (io/lock.py)."""

from __future__ import annotations

import errno
import fcntl
import os

from mhjax.config import ConfigError

WRITE_LOCK = ".mhjax.write.lock"  # its own file: closing it never drops a command's W/.mhjax.lock


class SharedWrite:
    """``with SharedWrite(workdir_path): read, merge, write``."""

    def __init__(self, workdir: str):
        self.workdir, self.file = os.fspath(workdir), None

    def __enter__(self):
        try:
            os.makedirs(self.workdir, exist_ok=True)
            self.file = open(os.path.join(self.workdir, WRITE_LOCK), "a")
        except OSError as exc:
            raise ConfigError(
                f"--workdir: cannot use {self.workdir} ({type(exc).__name__}: {exc.strerror or exc})"
            ) from None
        try:
            fcntl.lockf(self.file, fcntl.LOCK_EX)
        except OSError as exc:
            no_locks(exc, self.file, self.workdir)
            self.file.close()
            raise
        return self

    def __exit__(self, *exc):
        fcntl.lockf(self.file, fcntl.LOCK_UN)
        self.file.close()


def no_locks(exc: OSError, file, workdir: str) -> None:
    """A filesystem without POSIX locks (NFS without its lock manager): a one-line ConfigError."""
    if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
        file.close()
        raise ConfigError(
            f"--workdir: {workdir} is on a filesystem without POSIX locks ({exc.strerror}); use a local "
            "disk or NFS with locking (docs/shards.md)"
        ) from None
