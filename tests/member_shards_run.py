"""Run by tests/test_member_shards.py in a subprocess (XLA_FLAGS sets the fake CPU device count
before jax starts): a tiny sweep trained on every local device, its final parameters saved,
and what its compiled training chunk holds printed as one JSON line.

argv: strategy attention out.npz
"""

import json
import re
import sys

import jax
import numpy as np

from mhjax.experiments import make_experiment
from tests.conftest import tiny_sequence_config, tiny_train

CUSTOM_CALL = re.compile(r'= \(?f32\[(\d+),[^=]*custom-call\([^\n]*custom_call_target="mhjax_attention_(fwd|bwd)"')


def pallas_shapes(jaxpr) -> list[tuple]:
    """The leading dimension of every operand of every pallas_call in ``jaxpr``, nested ones
    included (shard_map's body: what each device runs)."""
    out = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            out.append([v.aval.shape[0] for v in eqn.invars if v.aval.shape])
        for sub in jax.core.subjaxprs(eqn) if hasattr(jax.core, "subjaxprs") else _subs(eqn):
            out += pallas_shapes(sub)
    return out


def _subs(eqn):
    for value in eqn.params.values():
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(v, jax.extend.core.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jax.extend.core.Jaxpr):
                yield v


def main(strategy: str, attention: str, out: str) -> None:
    from mhjax.train.loop import Sweep

    config = tiny_train(tiny_sequence_config(task=("copy", "cycle"), heads=(1, 2), seed=(0, 1, 2)), 3, 3, 3, 3)
    config.strategy, config.attention = strategy, attention
    sweep = Sweep(make_experiment(config))
    (program,) = sweep.programs
    states = sweep.init_states()
    chunk = sweep.chunk_fn(program, 3)
    consts = sweep.consts[program.name]
    text = chunk.lower(states[program.name], consts).compile().as_text()
    kernel_members = sorted({int(m) for m, _ in CUSTOM_CALL.findall(text)})
    jaxpr = jax.make_jaxpr(chunk)(states[program.name], consts)
    pallas = sorted({n for shapes in pallas_shapes(jaxpr.jaxpr) for n in shapes})
    states[program.name], metrics = sweep.run_chunk(program, states[program.name], 3)
    losses = sweep.host(metrics["loss"])  # (steps, members), in the program's member order
    params = sweep.member_states(states)
    names = [sweep.experiment.members[i].name for i in program.members]
    flat = {f"{name}/loss": losses[:, j] for j, name in enumerate(names)}
    flat |= {
        f"{name}/{jax.tree_util.keystr(path)}": np.asarray(leaf)
        for name, state in params.items()
        for path, leaf in jax.tree_util.tree_leaves_with_path(state.params)
    }
    np.savez(out, **flat)
    facts = {
        "devices": jax.device_count(),
        "members": len(program.members),
        "all_gathers": len(re.findall(r"\ball-gather(?:-start)?\(", text)),
        "collectives": len(
            re.findall(r"\b(?:all-reduce|all-to-all|collective-permute|reduce-scatter)(?:-start)?\(", text)
        ),
        "cpu_kernel_members": kernel_members,
        "pallas_members": pallas,
    }
    print(json.dumps(facts))


if __name__ == "__main__":
    main(*sys.argv[1:])
