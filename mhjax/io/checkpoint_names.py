"""What a checkpoint step folder holds, read from its files alone: no orbax, no JAX (``mhjax
status`` reads it in well under a second, while a run may be writing the next step).

orbax writes a step's tree structure as JSON (``<step>/default/_METADATA``: ``tree_metadata``,
one entry per leaf, its keys in ``key_metadata``); io/checkpoint.py writes every member's state
under ``members/<member_key>``."""

from __future__ import annotations

import json
import os

from mhjax.config import ConfigError

ITEM = "default"  # the states' item in a step directory (io/checkpoint.py)
METADATA = "_METADATA"  # orbax's tree metadata file in an item folder


def member_key(member_name: str) -> str:
    """Checkpoint key of a member: orbax joins nested keys with '.', so none may contain one."""
    return member_name.replace(".", "_")


def stored_member_keys(directory: str, step: int) -> list[str]:
    """The member keys a checkpoint step folder holds, in the order stored, from orbax's metadata
    file (no CheckpointManager, whose creation is a barrier every process of a distributed run
    must reach); unreadable: a one-line ConfigError."""
    where = os.path.join(directory, str(step), ITEM)
    try:
        with open(os.path.join(where, METADATA)) as f:
            leaves = json.load(f)["tree_metadata"].values()
        keys = [[k["key"] for k in leaf["key_metadata"]] for leaf in leaves]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        text = " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
        raise ConfigError(f"checkpoint {where}: unreadable, corrupt or truncated ({text})") from None
    return list(dict.fromkeys(k[1] for k in keys if len(k) > 1 and k[0] == "members"))
