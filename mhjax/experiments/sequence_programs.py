"""The sequence sweep's compiled programs: one set per shape group (experiments/architecture.py),
each laid out by the strategy, and the dry run's lines about them.

A sweep without architecture axes is one group named "", whose programs keep today's names
(``all``, ``h4``, ...); with several groups each program's name starts with its group's
(``a32-all``, ``w64-h4``). Strategies within a group:

unrolled: one program, every member written out unbatched at its own static head count
  (engine.Unrolled): on a CPU, XLA runs them concurrently on the cores, each with unbatched matmuls;
fused: one vmapped program at the group's finest head count (members' head counts traced). Fused
  fuses head counts of one attention width only: at a fixed head size each head count has a
  width of its own, hence a group and a program of its own (with a static head count);
grouped: one vmapped program per head count;
one_program: fused's single vmapped program with members listed head count by head count, whose
  attention runs group by group at static head counts (the model's ``layout``): grouped's cost,
  one copy of the model to compile.
"""

from __future__ import annotations

from mhjax.experiments import architecture, path_memory
from mhjax.experiments.architecture import ShapeGroup
from mhjax.experiments.sequence_recipe import SequenceRecipe
from mhjax.models import flops, member_layout
from mhjax.train.engine import Program, Unrolled


def by_heads(members, indices) -> dict[int, list[int]]:
    """{head count: member indices}, head counts ascending, indices in member order."""
    groups = {}
    for i in indices:
        groups.setdefault(members[i]["heads"], []).append(i)
    return dict(sorted(groups.items()))


def group_programs(config, members, group: ShapeGroup, strategy: str, attention, devices: int = 1) -> list[Program]:
    """The programs of one shape group under ``strategy`` (not auto), named without the group,
    for a member axis split over ``devices``."""
    heads = [members[i]["heads"] for i in group.members]

    def recipe(fine: int, **kwargs) -> SequenceRecipe:
        return SequenceRecipe(config, fine, attention=attention, model=group.model, **kwargs)

    if strategy == "unrolled":
        recipes = {h: recipe(h, static_heads=True) for h in set(heads)}
        return [Program("all", list(group.members), Unrolled([recipes[h] for h in heads]))]
    finest = architecture.fine_heads(group, members)  # divides the group's attention width
    groups = by_heads(members, group.members)
    if strategy == "one_program":
        # Only the attention core is per head count; the rest of the model, the optimiser
        # and the data are one vmapped copy (an Unrolled group per head count compiled the
        # whole step once per group: ~1 minute for the 64-member paper sweep on 2 cores).
        # Over several devices, each device's shard holds the same groups where they split
        # evenly (models/member_layout.py): one program, the same work on every device.
        order, layout = member_layout.spread(groups, devices)
        return [Program("all", order, recipe(finest, static_heads=False, layout=layout))]
    if strategy == "fused":
        return [Program("all", list(group.members), recipe(finest, static_heads=len(set(heads)) == 1))]
    return [Program(f"h{h}", idx, recipe(h, static_heads=True)) for h, idx in groups.items()]


def programs(config, members, groups: list[ShapeGroup], strategy: str, attention, devices: int = 1) -> list[Program]:
    """Every group's programs, each name prefixed by its group's (when the sweep has several)."""
    out = []
    for group in groups:
        for p in group_programs(config, members, group, strategy, attention, devices):
            out.append(p._replace(name=f"{group.name}-{p.name}") if group.name else p)
    return out


def of_group(programs_: list[Program], group: ShapeGroup) -> list[Program]:
    """The programs whose members are ``group``'s."""
    inside = set(group.members)
    return [p for p in programs_ if p.members[0] in inside]


def group_lines(experiment, programs_: list[Program], backend: str) -> list[str]:
    """One line per shape group: its model, members, head counts and sizes, its programs and the
    roofline's rate and memory for the group alone (models/cost.py); none for a single group."""
    groups, members = experiment.groups, experiment.members
    if len(groups) == 1:
        return []
    out = [f"{len(groups)} shape groups (members of one parameter shape and dropout share programs):"]
    for group in groups:
        mine = of_group(programs_, group)
        m = group.model
        heads = sorted({members[i]["heads"] for i in group.members})
        sizes = ", ".join(map(str, architecture.head_sizes(group, members)))
        p = experiment.price(mine, backend)
        out.append(
            f"  {group.name}: width {m.width}, {m.num_layers} layer(s), MLP {m.mlp_dim}, dropout {m.dropout:g}, "
            f"attention width {m.attention} (head size {sizes}); {len(group.members)} member(s) at heads "
            f"{', '.join(map(str, heads))}; programs {', '.join(p_.name for p_ in mine)}; "
            f"~{p['member_steps_per_s']:,.0f} member-steps/s and ~{p['memory_per_device_bytes'] / 2**30:.2f} GiB "
            f"on one {p['device'].name} (roofline)"
        )
    return out


def step_gflop(config, member) -> dict:
    """{"gflop_per_step": analytic training FLOPs of one step / 1e9} where the sweep has
    architecture axes (its members' sizes differ: results.json, results.md and the tables carry
    it); {} else, so that today's results keep their fields."""
    if not architecture.swept(config):
        return {}
    m, d = config.model, config.data
    model = architecture.member_model(config, member)
    sizes = (d.batch_size, m.seq_len, model.width, model.num_layers, model.mlp_dim, m.vocab_size)
    return {"gflop_per_step": flops.train_step_flops(*sizes, model.attention_width) / 1e9}


MATMUL_NOTE = (
    "matmul GFLOP/step: the model's matrix products, forward + 2x backward, causal attention at half "
    "(models/flops.py), the same in any dtype; the estimate's GFLOP count every FLOP the priced program runs"
)


def member_lines(experiment, running: str = "jax") -> list[str]:
    """Per member: parameters, analytic GFLOP per step and estimated memory on the attention path
    the run takes (``running``: path_memory.PATHS); then the totals."""
    config = experiment.config
    m, d = config.model, config.data
    lines = [f"{'member':<24} {'params':>9} {'matmul GFLOP/step':>18} {'est. memory':>12}"]
    total_mem = total_flops = 0.0
    for member in experiment.members:
        model = architecture.member_model(config, member)
        sizes = (d.batch_size, m.seq_len, model.width, model.num_layers, model.mlp_dim)
        step_flops = flops.train_step_flops(*sizes, m.vocab_size, model.attention_width)
        params = experiment.member_info(member)["params"]
        mem = path_memory.member_bytes(experiment, member, running)  # params, grads, Adam m and v; activations
        total_mem, total_flops = total_mem + mem, total_flops + step_flops
        lines.append(f"{member.name:<24} {params:>9,} {step_flops / 1e9:>18.3f} {mem / 2**20:>10.1f} MiB")
    total = total_flops * config.train.steps
    lines.append(
        f"total: {total / 1e12:.2f} TFLOP of matmuls in training, "
        f"~{total_mem / 2**20:.0f} MiB if all members run at once"
    )
    lines.append(MATMUL_NOTE)
    return lines
