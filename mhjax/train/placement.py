"""Where member states live: the member axis sharded over every device of every process.

Members never talk to each other, so sharding the leading member axis over a 1-D mesh
needs no collectives: each device runs the whole step on its own shard (``mesh_for``,
train/engine.py's per_shard), its kernels included. With several processes (jax.distributed), jax.devices() is the
global device list and each process computes the members on its own devices.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from mhjax.models.member_layout import MEMBER_AXIS as AXIS
from mhjax.train import peers


class Placement:
    """``abstract``: the devices are compile-only (a target's topology, train/target.py): ``put``
    returns shapes and dtypes placed on them, nothing is transferred."""

    def __init__(self, devices=None, abstract: bool = False):
        devices = list(devices or jax.devices())
        self.abstract = abstract
        # Auto axes: XLA propagates the member sharding through the vmapped step (no
        # sharding-in-types bookkeeping inside optax/flax code).
        self.mesh = jax.make_mesh((len(devices),), (AXIS,), axis_types=(AxisType.Auto,), devices=devices)

    @property
    def size(self) -> int:
        return self.mesh.size

    def sharding(self, num_members: int) -> NamedSharding:
        """Shard the member axis when it divides evenly over the devices; else replicate
        (correct, but every device then computes every member of that program)."""
        spec = PartitionSpec(AXIS) if num_members % self.size == 0 else PartitionSpec()
        return NamedSharding(self.mesh, spec)

    def sharded(self, num_members: int) -> bool:
        """Whether a program of ``num_members`` members is split over several devices."""
        return self.size > 1 and num_members % self.size == 0

    def mesh_for(self, num_members: int):
        """The mesh a program of ``num_members`` members runs per device on (engine.per_shard);
        None where it is not split (one device, or replicated: every device runs every member)."""
        return self.mesh if self.sharded(num_members) else None

    def put(self, tree, num_members: int):
        """Host arrays with a leading member axis -> global arrays; each process supplies
        only its own shards (all processes hold the same host values)."""
        sharding = self.sharding(num_members)

        def place(x):
            x = np.asarray(x)
            if self.abstract:
                return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
            return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

        return jax.tree_util.tree_map(place, tree)

    def to_host(self, tree):
        return to_host(tree)

    def say_programs(self, sweep, log) -> None:
        """With several processes: the line saying which members of each program this one computes."""
        if jax.process_count() > 1:
            for p in sweep.programs:
                mine = [sweep.experiment.members[p.members[j]].name for j in self.local_members(len(p.members))]
                log(f"process {jax.process_index()}/{jax.process_count()} computes program {p.name}: {', '.join(mine)}")

    def local_members(self, num_members: int) -> list[int]:
        """Positions along the member axis whose shards this process computes."""
        sharding = self.sharding(num_members)
        mine = set()
        for index in sharding.addressable_devices_indices_map((num_members,)).values():
            mine.update(range(num_members)[index[0]])
        return sorted(mine)


def maybe_initialize_distributed(
    coordinator: str | None, num_processes: int | None, process_id: int | None, auto: bool
) -> None:
    """jax.distributed.initialize: explicit (coordinator/num/id) or auto-detected (SLURM, TPU pods);
    a lost process ends the others with the requeue code (train/peers.py)."""
    if coordinator or auto:
        peers.initialize(coordinator, num_processes, process_id)


def to_host(tree):
    """Global arrays -> numpy on every process (gathers across processes if needed)."""
    if jax.process_count() > 1:
        return multihost_utils.process_allgather(tree, tiled=True)
    return jax.device_get(tree)
