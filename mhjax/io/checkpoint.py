"""Sweep checkpoints with orbax: atomic step directories under W/checkpoints.

One checkpoint holds every program's stacked member states plus per-program
training seconds. W/mhjax.json records the mhjax version and the resolved config;
a workdir written with another version or config is refused rather than mixed.
"""
from __future__ import annotations

import json
import os

import jax
import orbax.checkpoint as ocp

from mhjax import __version__
from mhjax.config import ConfigError

METADATA = "mhjax.json"


class SweepCheckpointer:
    def __init__(self, workdir: str, keep: int = 2):
        self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=False, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, tree) -> None:
        self.manager.save(step, args=ocp.args.StandardSave(tree), force=True)
        self.manager.wait_until_finished()

    def restore(self, step: int, abstract_tree):
        """Restore into the structure/shapes of abstract_tree; a mismatch is a one-line ConfigError."""
        target = jax.tree_util.tree_map(ocp.utils.to_shape_dtype_struct, abstract_tree)
        try:
            return self.manager.restore(step, args=ocp.args.StandardRestore(target))
        except Exception as exc:  # orbax raises many types for corrupt/mismatched files
            detail = " ".join(str(exc).split())[:300]
            raise ConfigError(f"checkpoint {self.directory}/{step}: cannot restore into this sweep ({type(exc).__name__}: {detail})") from None

    def close(self) -> None:
        self.manager.close()


def check_or_write_metadata(workdir: str, config_dict: dict, kind: str) -> bool:
    """True if the workdir already belongs to this exact config (resume); writes it if new."""
    path = os.path.join(workdir, METADATA)
    current = {"mhjax_version": __version__, "experiment": kind, "config": config_dict}
    if os.path.exists(path):
        try:
            with open(path) as f:
                stored = json.load(f)
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"--workdir: {path} is unreadable ({exc.__class__.__name__}); use a new workdir") from None
        if stored.get("mhjax_version") != __version__:
            raise ConfigError(
                f"--workdir: {workdir} was written by mhjax {stored.get('mhjax_version')}, this is {__version__}; use a new workdir"
            )
        if stored.get("config") != json.loads(json.dumps(config_dict)):
            diff = _first_difference(stored.get("config", {}), json.loads(json.dumps(config_dict)))
            raise ConfigError(f"--workdir: {workdir} holds a run of another config ({diff}); use a new workdir or the same config")
        return True
    os.makedirs(workdir, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(current, f, indent=2, sort_keys=True)
    os.replace(tmp, path)
    return False


def _first_difference(a, b, prefix="config") -> str:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{prefix}.{key} present in only one"
            if a[key] != b[key]:
                return _first_difference(a[key], b[key], f"{prefix}.{key}")
    return f"{prefix}: stored {a!r}, now {b!r}"
