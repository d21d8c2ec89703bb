"""The sequence sweep's compiled programs: one set per shape group (experiments/architecture.py),
each laid out by the strategy (which mhjax.plan chooses and describes).

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

from mhjax.experiments import architecture
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
