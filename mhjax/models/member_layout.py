"""one_program's member layout when the member axis is split over devices (issue 39).

A layout ((members, heads), ...) lists a program's head-count groups along the member axis
(attention.layout_attention). When the training step runs per device on its shard of the
member axis (jax.shard_map over ``MEMBER_AXIS``, train/engine.py), each device's attention
sees members / N of them, and so only the part of the layout those members make up.

Two ways to keep static head counts per group on every device, both here:
- ``spread``: the plan orders the members so that every device's shard holds the same groups
  (each group's members dealt out evenly): one program, and every device does the same
  work. Possible when each group's size is a multiple of the device count (the paper sweep:
  16 members per head count, 2 per H200 of 8);
- ``on_shard``: otherwise each device runs its own shard's groups, a ``lax.switch`` on the
  device's index over the distinct shard layouts (one branch each; only the attention core
  is in the branches). Correct for any layout, but the devices' work differs.
"""

from __future__ import annotations

import jax

MEMBER_AXIS = "members"  # the mesh axis the member axis is sharded over (train/placement.py)

Layout = tuple[tuple[int, int], ...]  # (members, heads) per group, in member-axis order


def _merge(groups) -> Layout:
    """Consecutive groups at one head count as one (the kernels read any run of members)."""
    out = []
    for n, h in groups:
        if out and out[-1][1] == h:
            out[-1] = (out[-1][0] + n, h)
        elif n:
            out.append((n, h))
    return tuple(out)


def split(layout: Layout, shards: int) -> list[Layout]:
    """The layout of each of ``shards`` equal consecutive slices of the member axis."""
    total = sum(n for n, _ in layout)
    if shards < 1 or total % shards:
        raise ValueError(f"member layout: {total} members do not split over {shards} devices")
    size, out = total // shards, []
    for shard in range(shards):
        lo, hi, groups, first = shard * size, (shard + 1) * size, [], 0
        for n, h in layout:
            overlap = min(hi, first + n) - max(lo, first)
            if overlap > 0:
                groups.append((overlap, h))
            first += n
        out.append(_merge(groups))
    return out


def spread(groups: dict[int, list[int]], shards: int) -> tuple[list[int], Layout]:
    """(member order, layout) of one_program's members ``groups`` ({heads: member indices})
    over ``shards`` devices: each device's slice holds len(members) / shards of every group,
    where every group's size is a multiple of ``shards``; else the groups one after another
    (what one device gets), and on_shard switches per device."""
    if shards > 1 and all(len(idx) % shards == 0 for idx in groups.values()):
        order, layout = [], []
        for shard in range(shards):
            for h, idx in groups.items():
                per = len(idx) // shards
                order += idx[shard * per : (shard + 1) * per]
                layout.append((per, h))
        return order, _merge(layout)
    return [i for idx in groups.values() for i in idx], tuple((len(idx), h) for h, idx in groups.items())


def on_shard(layout: Layout, axis_size: int, run):
    """``run(local layout)`` for the members this device holds: the whole layout when the
    member axis is all here (``axis_size`` members); else the layout of this device's slice,
    the same on every device where the plan spread the groups, a switch on the device's
    index along MEMBER_AXIS (inside train/engine.py's shard_map) where it could not."""
    total = sum(n for n, _ in layout)
    if axis_size == total:
        return run(layout)
    if axis_size < 1 or total % axis_size:
        raise ValueError(f"layout_attention: vmapped over {axis_size} members, the layout has {total}")
    shards = split(layout, total // axis_size)
    distinct = sorted(set(shards), key=shards.index)
    if len(distinct) == 1:
        return run(distinct[0])
    which = jax.numpy.asarray([distinct.index(s) for s in shards])[jax.lax.axis_index(MEMBER_AXIS)]
    return jax.lax.switch(which, [lambda local=local: run(local) for local in distinct])
