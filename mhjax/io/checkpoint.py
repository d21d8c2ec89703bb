"""Sweep checkpoints with orbax: atomic step directories under W/checkpoints.

One checkpoint holds every program's stacked member states plus per-program
training seconds. W/mhjax.json records the mhjax version and the resolved config;
a workdir written with another version or config is refused rather than mixed.
"""

from __future__ import annotations

import json
import os
import sys
import threading

import jax
import orbax.checkpoint as ocp
from etils import epath

from mhjax import __version__
from mhjax.config import ConfigError

METADATA = "mhjax.json"


class SweepCheckpointer:
    def __init__(self, workdir: str, keep: int = 2):
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        # A save killed before its final rename leaves only a *.orbax-checkpoint-tmp dir, never a
        # step: latest_step() ignores it, and it is removed here and when that step is saved again.
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=False, create=True, cleanup_tmp_directories=True
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, tree) -> None:
        self.manager.save(step, args=ocp.args.StandardSave(tree), force=True)
        self.manager.wait_until_finished()

    def restore(self, step: int, abstract_tree):
        """Restore into the structure/shapes of abstract_tree; a mismatch is a one-line ConfigError."""
        target = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, abstract_tree)
        where = os.path.join(self.directory, str(step))
        _quiet_abandoned_reads()
        try:  # the stored tree's paths, shapes and dtypes (JSON metadata; nothing is unpickled)
            stored = ocp.StandardCheckpointHandler().metadata(epath.Path(where) / "default")
            stored = getattr(stored, "tree", stored)
        except Exception as exc:
            detail = " ".join(str(exc).split())[:300]
            raise ConfigError(
                f"checkpoint {where}: unreadable, corrupt or truncated ({type(exc).__name__}: {detail})"
            ) from None
        mismatch = describe_mismatch(stored, target)
        if mismatch:
            raise ConfigError(f"checkpoint {where}: does not match this sweep: {mismatch}")
        try:
            return self.manager.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as exc:  # orbax raises many types for corrupt/mismatched files
            detail = " ".join(str(exc).split())[:300]
            raise ConfigError(
                f"checkpoint {self.directory}/{step}: cannot restore into this sweep ({type(exc).__name__}: {detail})"
            ) from None

    def close(self) -> None:
        self.manager.close()


def _loop_closed(exc) -> bool:
    return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"


def _quiet_abandoned_reads() -> None:
    """After a failed read, tensorstore still completes the read's other in-flight requests
    and hands them to the asyncio loop orbax has already closed; each reports "Event loop is
    closed" from a callback thread (as an unraisable exception, or through sys.excepthook or
    threading.excepthook, depending on the thread), i.e. a traceback on stderr around our
    one-line error. They are harmless: drop exactly those and pass everything else on.
    Installed before a restore starts, since the callbacks may fire before the error surfaces."""
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


def check_or_write_metadata(workdir: str, config_dict: dict, kind: str, extra: dict | None = None) -> bool:
    """True if the workdir already belongs to this exact config (resume); writes it if new,
    with the experiment's ``extra`` fields (e.g. ``tasks``: where plug-in tasks came from)."""
    path = os.path.join(workdir, METADATA)
    current = {"mhjax_version": __version__, "experiment": kind, "config": config_dict, **(extra or {})}
    if os.path.exists(path):
        try:
            with open(path) as f:
                stored = json.load(f)
            if not isinstance(stored, dict):
                raise ValueError("not a JSON object")
        except (OSError, ValueError) as exc:  # ValueError: JSON and UTF-8 decoding errors
            raise ConfigError(
                f"--workdir: {path} is unreadable ({exc.__class__.__name__}); use a new workdir"
            ) from None
        if stored.get("mhjax_version") != __version__:
            raise ConfigError(
                f"--workdir: {workdir} was written by mhjax {stored.get('mhjax_version')}, this is {__version__}; "
                "use a new workdir"
            )
        if stored.get("config") != json.loads(json.dumps(config_dict)):
            diff = _first_difference(stored.get("config", {}), json.loads(json.dumps(config_dict)))
            raise ConfigError(
                f"--workdir: {workdir} holds a run of another config ({diff}); use a new workdir or the same config"
            )
        return True
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ConfigError(f"--workdir: {workdir} exists and is not a folder")
    tmp = path + ".tmp"
    try:
        os.makedirs(workdir, exist_ok=True)
        with open(tmp, "w") as f:  # atomic: a kill leaves at most the .tmp, never a half mhjax.json
            json.dump(current, f, indent=2, sort_keys=True)
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(f"--workdir: cannot write {path} ({type(exc).__name__}: {exc.strerror or exc})") from None
    return False


def _first_difference(a, b, prefix="config") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{prefix}.{key} present in only one"
            if a[key] != b[key]:
                return _first_difference(a[key], b[key], f"{prefix}.{key}")
    return f"{prefix}: stored {a!r}, now {b!r}"
