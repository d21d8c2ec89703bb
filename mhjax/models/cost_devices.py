"""A sweep over N devices in the cost model (models/cost.py's sweep_cost): what each device computes,
the busiest device's work per sweep step, and the traffic between devices and to the host.

The design (train/placement.py, train/engine.per_shard): a program's member axis is split over the
devices where they divide its members, each device running the whole step on its consecutive slice
(one_program's head-count groups as models/member_layout.split cuts them); a program whose members
do not divide the devices is replicated, every device computing every member. Programs run one
after another, and each device works through its own queue, so a sweep step takes the busiest
device's time: the sweep's member-steps/s is its members over that time.

Collectives: none by design. Members are independent, so the training chunk and the evaluation
exchange nothing between devices (the deviceless compile checks the chunk: train/deviceless.py
warns of any). What leaves a device is a copy to the host: at each checkpoint its members'
states (parameters and Adam's two moments, float32: 12 bytes a parameter), and after each chunk
and evaluation a few numbers per member. Over several processes (jax.distributed) those host
copies become an all-gather across processes (train/placement.to_host); one host (``NAMExN``)
has none.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CHECKPOINT_BYTES_PER_PARAM = 12.0  # parameters, Adam's m and v (float32; the step counters aside)


def device_groups(groups, devices: int) -> list[list[tuple[int, int, bool]]]:
    """Each of ``devices`` devices' groups (members, fine heads, mixed) of one program: its
    consecutive slice of the member axis where the members divide the devices, else all of them
    (replicated)."""
    size = sum(n for n, _, _ in groups)
    if devices <= 1 or size % devices:
        return [list(groups) for _ in range(max(devices, 1))]
    per, out = size // devices, []
    for d in range(devices):
        lo, hi, first, mine = d * per, (d + 1) * per, 0, []
        for n, fine, mixed in groups:
            overlap = min(hi, first + n) - max(lo, first)
            if overlap > 0:
                mine.append((overlap, fine, mixed))
            first += n
        out.append(mine)
    return out


@dataclass
class Load:
    """One device's work per sweep step (every member one step), over the programs it runs."""

    seconds: float = 0.0
    member_steps: int = 0
    flops: float = 0.0
    compiled_bytes: float = 0.0  # the compiled program's bytes (cost.device_bytes)
    states: float = 0.0  # bytes: parameters, gradients, Adam's moments of the members it holds
    activations: float = 0.0  # bytes: the largest program's activations on it
    checkpoint_bytes: float = 0.0  # copied to the host at each checkpoint
    replicated: list = field(default_factory=list)  # indices of the programs it computes whole

    def add(self, rows, state_bytes_per_member: float, checkpoint_bytes_per_member: float) -> None:
        """One program's groups on this device: rows of (members, step seconds, FLOPs, compiled
        bytes, activation bytes), each per member."""
        n_all = sum(r[0] for r in rows)
        self.seconds += sum(n * s for n, s, _, _, _ in rows)
        self.member_steps += n_all
        self.flops += sum(n * f for n, _, f, _, _ in rows)
        self.compiled_bytes += sum(n * b for n, _, _, b, _ in rows)
        self.states += n_all * state_bytes_per_member
        self.activations = max(self.activations, sum(n * a for n, _, _, _, a in rows))
        self.checkpoint_bytes += n_all * checkpoint_bytes_per_member

    @property
    def memory(self) -> float:
        return self.states + self.activations


def summary(loads: list[Load], replicated: list[int]) -> dict:
    """sweep_cost's ``per_device``: the busiest device's figures per sweep step."""
    busiest = max(loads, key=lambda load: load.seconds)
    return {
        "devices": len(loads),
        "member_steps_per_step": busiest.member_steps,
        "flops_per_step": busiest.flops,
        "compiled_bytes_per_step": busiest.compiled_bytes,
        "seconds_per_step": busiest.seconds,
        "replicated_programs": replicated,
        "collective_bytes_per_step": 0.0,  # by design: members are independent (the module's doc)
        "host_bytes_per_checkpoint": max(load.checkpoint_bytes for load in loads),
    }


def lines(many: dict, one: dict, name: str) -> list[str]:
    """The dry run's lines for a sweep over N devices: its predicted rate beside one device's
    (``many``, ``one``: sweep_cost's figures of the sweep over N devices and over one), the busiest
    device's work per sweep step, replicated programs and what moves between devices."""
    d = many["per_device"]
    n, rate, alone = d["devices"], many["member_steps_per_s"], one["member_steps_per_s"]
    out = [
        f"  over {n} x {name}: ~{rate:,.0f} member-steps/s for the whole sweep, against ~{alone:,.0f} on one "
        f"({rate / alone:.2f}x); per device and sweep step (the busiest): {d['member_steps_per_step']} member-steps, "
        f"{_amount(d['flops_per_step'])}FLOP, {_amount(d['compiled_bytes_per_step'])}B, "
        f"~{d['seconds_per_step'] * 1e3:,.3g} ms"
    ]
    if d["replicated_programs"]:
        out.append(
            f"  {len(d['replicated_programs'])} program(s) replicated: their members do not divide the {n} devices, "
            "so each device computes all of them"
        )
    out.append(
        f"  between devices: none (members are independent: no collective in the training chunk or the "
        f"evaluation); to the host at each checkpoint: {d['host_bytes_per_checkpoint'] / 2**20:,.1f} MiB per device"
    )
    return out


def _amount(value: float) -> str:
    """``value`` with an SI prefix and three significant figures: "97.0 G", "1.26 M"."""
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= factor:
            return f"{value / factor:.3g} {prefix}"
    return f"{value:.3g} "
