"""Sweep checkpoints with orbax: atomic step directories (a workdir's checkpoints folder, io/workdir.py).

One checkpoint holds every member's own state and training seconds, and beside them, in the
same step directory, the host records (train/records.py).
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import threading
import time

import jax
import orbax.checkpoint as ocp
from etils import epath

from mhjax.config import ConfigError
from mhjax.io.checkpoint_names import member_key, stored_member_keys  # noqa: F401 (their home before)
from mhjax.io.results import WriteFailed, os_error_in

RECORDS = "records"  # the host records' item in a step directory, beside the states ("default")


class SweepCheckpointer:
    def __init__(self, directory: str, keep: int = 2):
        self.directory = os.path.abspath(directory)
        # A save killed before its final rename leaves only a *.orbax-checkpoint-tmp dir, never a
        # step: latest_step() ignores it, and it is removed here and when that step is saved again.
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=False, create=True, cleanup_tmp_directories=True
        )
        # Named items (the states, "default", and the host records) also read a checkpoint saved
        # before the records existed: its states are the same "default" item.
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("default", RECORDS))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, tree, records: dict | None = None) -> None:
        """Checkpoint ``step``: ``tree`` (the states) and ``records`` (a JSON object: what the host
        accumulated) in one step directory, renamed into place only once both are written."""
        items = {"default": ocp.args.StandardSave(tree)}
        if records is not None:
            items[RECORDS] = ocp.args.JsonSave(records)
        previous = self.latest_step()
        _quiet_abandoned_io()  # before the save starts: a failed write's callbacks fire at once
        _remove_failed_save(self.directory, step)  # an earlier failed save of this step: its leftovers
        try:
            self.manager.save(step, args=ocp.args.Composite(**items), force=True)
            self.manager.wait_until_finished()
        except Exception as exc:
            cause = os_error_in(exc)
            if cause is None:
                raise
            # orbax writes into a temporary folder renamed into place only when complete: the
            # previous checkpoint is still the latest. The folder goes now, so that a retry in this
            # process (the Python API) starts clean; a killed run's leftovers go at the next start.
            _remove_failed_save(self.directory, step)
            kept = f"checkpoint {previous} stays the latest" if previous is not None else "no checkpoint yet"
            hint = f"; {kept}: free some space and run the same command to resume"
            raise WriteFailed(os.path.join(self.directory, str(step)), cause, hint) from None

    def member_keys(self, step: int) -> list[str]:
        """The member keys (``member_key``) checkpoint ``step`` holds, from its metadata alone."""
        return stored_member_keys(self.directory, step)

    def has_records(self, step: int) -> bool:
        """Whether checkpoint ``step`` holds host records (checkpoints of mhjax before them do not)."""
        return os.path.isdir(os.path.join(self.directory, str(step), RECORDS))

    def restore_records(self, step: int) -> dict | None:
        """The host records saved with checkpoint ``step``, or None when it has none."""
        if not self.has_records(step):
            return None
        where = os.path.join(self.directory, str(step), RECORDS)
        try:
            records = self.manager.restore(step, args=ocp.args.Composite(**{RECORDS: ocp.args.JsonRestore()}))[RECORDS]
        except Exception as exc:
            raise ConfigError(f"checkpoint {where}: unreadable ({_one_line(exc)})") from None
        if not isinstance(records, dict):
            raise ConfigError(f"checkpoint {where}: not a JSON object")
        return records

    def restore_raw(self, step: int):
        """Checkpoint ``step``'s tree as saved (numpy leaves), read without a template."""
        where = os.path.join(self.directory, str(step))
        _quiet_abandoned_io()
        try:
            return self.manager.restore(step, args=ocp.args.Composite(default=ocp.args.StandardRestore()))["default"]
        except Exception as exc:
            raise ConfigError(f"checkpoint {where}: unreadable ({_one_line(exc)})") from None

    def stored_tree(self, step: int):
        """Checkpoint ``step``'s tree of shapes and dtypes (orbax's JSON metadata; nothing is read
        or unpickled); a one-line ConfigError when it cannot be read."""
        where = os.path.join(self.directory, str(step))
        _quiet_abandoned_io()
        try:
            stored = ocp.StandardCheckpointHandler().metadata(epath.Path(where) / "default")
        except Exception as exc:
            raise ConfigError(f"checkpoint {where}: unreadable, corrupt or truncated ({_one_line(exc)})") from None
        return getattr(stored, "tree", stored)

    def restore(self, step: int, abstract_tree):
        """Restore into the structure/shapes of abstract_tree; a mismatch is a one-line ConfigError."""
        target = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, abstract_tree)
        where = os.path.join(self.directory, str(step))
        stored = self.stored_tree(step)
        mismatch = describe_mismatch(stored, target)
        if mismatch:
            raise ConfigError(f"checkpoint {where}: does not match this sweep: {mismatch}")
        try:
            return self.manager.restore(step, args=ocp.args.Composite(default=ocp.args.StandardRestore(target)))[
                "default"
            ]
        except Exception as exc:  # orbax raises many types for corrupt/mismatched files
            raise ConfigError(
                f"checkpoint {self.directory}/{step}: cannot restore into this sweep ({_one_line(exc)})"
            ) from None

    def close(self) -> None:
        self.manager.close()


def _one_line(exc: BaseException) -> str:
    """``Type: message`` on one line, at most 300 characters of message (orbax's run long)."""
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


def _tree_state(path: str) -> list:
    return sorted(
        (os.path.relpath(os.path.join(root, name), path), os.path.getsize(os.path.join(root, name)))
        for root, _, files in os.walk(path)
        for name in files
        if os.path.exists(os.path.join(root, name))
    )


def _remove_failed_save(directory: str, step: int, quiet_s: float = 0.2, limit_s: float = 10.0) -> None:
    """Remove the temporary folder of a save that failed. When one item's write fails, orbax
    raises at once while the other items' writes (tensorstore threads) are still landing in that
    folder: removing it under them fails (ENOTEMPTY) or leaves it half rebuilt, and the next save
    of the same step then fails. So wait until the folder stops changing, then remove it."""
    deadline = time.monotonic() + limit_s
    for path in glob.glob(os.path.join(glob.escape(directory), f"{step}.orbax-checkpoint-tmp*")):
        before = _tree_state(path)
        while time.monotonic() < deadline:
            time.sleep(quiet_s)
            now = _tree_state(path)
            if now == before:
                shutil.rmtree(path, ignore_errors=True)
                if not os.path.exists(path):
                    break
                now = _tree_state(path)
            before = now


def _loop_closed(exc) -> bool:
    return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"


def _quiet_abandoned_io() -> None:
    """After a failed read or write (a full disk: hundreds of tensorstore writes in flight),
    tensorstore still completes the operation's other requests and hands them to the asyncio loop
    orbax has already closed; each reports "Event loop is closed" from a callback thread (as an
    unraisable exception, or through sys.excepthook or threading.excepthook, depending on the
    thread): on a 12 MB tmpfs, over a thousand tracebacks on stderr around our one-line error.
    They are harmless: drop exactly those and pass everything else on. (Not even to the log: they
    can fire after the command has ended and restored the handlers of whoever called it.)
    Installed before a restore or save starts, since the callbacks may fire before the error
    surfaces."""
    if getattr(sys.unraisablehook, "_mhjax_quiet", False):
        return
    unraisable, excepthook, thread_hook = sys.unraisablehook, sys.excepthook, threading.excepthook

    def quiet_unraisable(info):
        if not _loop_closed(info.exc_value):
            unraisable(info)

    def quiet_excepthook(kind, exc, tb):
        if not _loop_closed(exc):
            excepthook(kind, exc, tb)

    def quiet_thread_hook(args):
        if not _loop_closed(args.exc_value):
            thread_hook(args)

    quiet_unraisable._mhjax_quiet = True
    sys.unraisablehook, sys.excepthook, threading.excepthook = quiet_unraisable, quiet_excepthook, quiet_thread_hook


def _flat(tree) -> dict:
    """{'a.b.c': (shape, dtype name)} of a tree of arrays, ShapeDtypeStructs or orbax metadata."""
    out = {}
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        name = ".".join(str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path)
        dtype = getattr(leaf, "dtype", None)
        out[name] = (tuple(getattr(leaf, "shape", ())), None if dtype is None else str(jax.numpy.dtype(dtype)))
    return out


def describe_mismatch(stored, target) -> str | None:
    """The first difference between a checkpoint's tree and the tree a sweep needs, in words."""
    if isinstance(stored, dict) and isinstance(target, dict) and isinstance(stored.get("members"), dict):
        have, need = sorted(stored["members"]), sorted(target.get("members", {}))
        if have != need:
            extra, missing = sorted(set(have) - set(need)), sorted(set(need) - set(have))
            return (
                f"it holds members {', '.join(have)} but this sweep has {', '.join(need)}"
                f" (missing {', '.join(missing) or 'none'}, extra {', '.join(extra) or 'none'}): another sweep"
                " (head counts, tasks, seeds or learning rates)"
            )
    have, need = _flat(stored), _flat(target)
    for name in need:
        if name not in have:
            return f"{name} is not in the checkpoint (another model: e.g. num_layers or mlp layout)"
    for name in have:
        if name not in need:
            return f"the checkpoint has {name}, which this sweep does not (another model: e.g. num_layers)"
    for name, (shape, dtype) in need.items():
        if have[name][0] != shape:
            return (
                f"{name} has shape {have[name][0]} in the checkpoint, this config needs {shape} "
                "(another width, mlp_dim, vocab_size or seq_len)"
            )
        if have[name][1] is not None and dtype is not None and have[name][1] != dtype:
            return f"{name} has dtype {have[name][1]} in the checkpoint, this config needs {dtype}"
    return None
