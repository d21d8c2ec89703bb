"""What a Workdir has read (io/workdir.py): each file read once while it is unchanged, and read
again once it changed, so that a Run held in a notebook follows a sweep that is still training."""

from __future__ import annotations

import os


class CachedReads:
    """A reader's memory: ``self._read`` {key: (signature of its file, value)}, set by the subclass."""

    @staticmethod
    def _signature(path: str):
        """What tells that a file or folder changed: its (inode, mtime, size), or those of each
        entry of the folder; None when it is missing."""
        try:
            if os.path.isdir(path):
                return tuple(
                    sorted((e.name, e.inode(), e.stat().st_mtime_ns, e.stat().st_size) for e in os.scandir(path))
                )
            stat = os.stat(path)
            return stat.st_ino, stat.st_mtime_ns, stat.st_size
        except OSError:
            return None

    def _cached(self, key, path: str, load):
        """``load()``'s value for ``key``: read once while ``path`` stays the same, and again once it
        changed, so that a Run held in a notebook follows a sweep that is still training."""
        signature = self._signature(path)
        hit = self._read.get(key)
        if hit is None or hit[0] != signature:
            hit = self._read[key] = (signature, load())
        return hit[1]
