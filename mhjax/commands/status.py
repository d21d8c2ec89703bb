"""`mhjax status --workdir W`: each member's step, state, checkpoint age, rate and time to finish
(io/sweep_state.py), read while another command may hold the workdir."""

from __future__ import annotations

import json

from mhjax.io.sweep_state import STARTING, sweep_status


def command(args, overrides) -> int:
    status = sweep_status(args.workdir)
    if args.json:
        print(json.dumps(status, indent=2))
        return 0
    print("\n".join(status_lines(status)))
    return 0


def status_lines(status: dict) -> list[str]:
    holder, shards = status["holder_pid"], status.get("shards")
    held = f"held by pid {holder}" if holder else "no command holds it"
    if shards and not holder:  # shards hold their own locks, never the workdir's while they train
        held = f"{len(shards)} shards, each held by the process that trains it (below)"
    if any(row["state"] == "starting" for row in status["members"]):
        held += f": {STARTING}, no chunk trained since it started"
    lines = [f"{status['workdir']}: {status['total_steps']} steps per member; {held}"]
    header = ("member", "state", "step", "checkpoint", "age", "member-steps/s", "to finish")
    rows = [header]
    for row in status["members"]:
        name = row["name"] if not row["part"] else f"{row['name']} ({row['part']})"
        rows.append(
            (
                name,
                row["state"],
                _text(row["step"]),
                _text(row["checkpoint_step"]),
                _duration(row["checkpoint_age_s"]),
                "-" if row["member_steps_per_s"] is None else f"{row['member_steps_per_s']:,.0f}",
                _duration(row["eta_s"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    if status.get("shards"):
        lines += _shard_lines(status["shards"])
    counts = {}
    for row in status["members"]:
        counts[row["state"]] = counts.get(row["state"], 0) + 1
    lines.append(", ".join(f"{n} {state}" for state, n in counts.items()) or "no members yet")
    return lines


def _shard_lines(shards: list[dict]) -> list[str]:
    """One row per shard (--shard I/N): its state, step, the pid holding its lock, its members."""
    rows = [("shard", "state", "step", "held by", "members", "to finish")]
    for shard in shards:
        rows.append(
            (
                shard["shard"],
                shard["state"],
                _text(shard["step"]),
                "-" if shard["holder_pid"] is None else f"pid {shard['holder_pid']}",
                str(len(shard["members"])),
                _duration(shard["eta_s"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]


def _text(value) -> str:
    return "-" if value is None else str(value)


def _duration(seconds) -> str:
    if seconds is None:
        return "-"
    seconds = float(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
