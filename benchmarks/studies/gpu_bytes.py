"""Bytes one training step moves in the program XLA compiles for a GPU, counted without a GPU.

The sweep's programs are compiled for a compile-only device built from an XLA GpuTargetConfig
(a deviceless compile: needs jax[cuda13] at jax's version, e.g. /work/venv-gpu, and
JAX_PLATFORMS=cpu; /work/shared/spec/gpu_attention.md, "Deviceless compile"), each as the
engine's one-step chunk. XLA gives no cost analysis there, so the bytes are hlo_parts.py's walk
of the compiled GPU HLO: each top-level kernel (fusion, Triton call, copy) reads its operands
and writes its results once. The Pallas kernel's calls are the exception: the walk would
charge each group's call its whole operands (every member's arrays, of which it reads its
group's blocks), so they count at pallas_attention.kernel_cost's bytes instead.

    JAX_PLATFORMS=cpu /work/venv-gpu/bin/python benchmarks/studies/gpu_bytes.py --target FILE
        [--config configs/paper.py] [--attention pallas|jax] [--strategy one_program]

models/cost.py's calibration was measured with this (paper config, 8 members, one_program).
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "studies"))
sys.path.insert(0, str(ROOT))

from cost_model import load_config  # noqa: E402
from hlo_cost import kernel_cost  # noqa: E402
from hlo_parts import KERNELS, bytes_by_part  # noqa: E402

from mhjax.experiments.sequence import SequenceExperiment  # noqa: E402
from mhjax.train import engine  # noqa: E402
from mhjax.train.loop import stack_constants  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="a GpuTargetConfig text proto (e.g. an H200's)")
    parser.add_argument("--config", default=str(ROOT / "configs" / "paper.py"))
    parser.add_argument("--attention", default="pallas", choices=("pallas", "jax"))
    parser.add_argument("--strategy", default="one_program")
    parser.add_argument("--scan-layers", default="off", choices=("off", "on"), help="config.model.scan_layers")
    args = parser.parse_args(argv)
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec

    text = Path(args.target).read_text()
    topology = topologies.get_topology_desc(platform="cuda", target_config=text, topology="1x1x1")
    sharding = NamedSharding(topologies.make_mesh(topology, (1,), ("x",)), PartitionSpec())
    config = copy.deepcopy(load_config(args.config))
    config.attention, config.strategy = args.attention, args.strategy
    # the walk charges a top-level op once and a fusion reading part of an operand the whole
    # operand: a scanned step's loop and stacked buffers would be miscounted (cost_model.py counts
    # unrolled layers too); --scan-layers on measures the scanned program with that caveat
    config.model.scan_layers = args.scan_layers
    experiment = SequenceExperiment(config)
    programs = experiment.programs(args.strategy, "gpu")  # resolved for a GPU: the kernel compiled, not interpreted
    on_device = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)  # noqa: E731
    parts, members, start = {}, 0, time.perf_counter()
    for program in programs:
        consts = stack_constants(experiment, program.members)
        states = jax.eval_shape(engine.make_init(program.recipe), consts)
        chunk = engine.make_train_chunk(program.recipe, 1)
        compiled = chunk.lower(jax.tree_util.tree_map(on_device, states), jax.tree_util.tree_map(on_device, consts))
        for part, nbytes in bytes_by_part(compiled.compile().as_text()).items():
            parts[part] = parts.get(part, 0.0) + nbytes
        members += len(program.members)
    walked = parts.pop(KERNELS, 0.0)
    if args.attention == "pallas":
        parts["Pallas kernels (analytic)"] = kernel_cost(experiment, programs)[1]
    total = sum(parts.values())
    print(
        f"{args.strategy}, attention={args.attention}, {members} members, "
        f"compiled in {time.perf_counter() - start:.0f} s"
    )
    print(f"GB per member-step: {total / members / 1e9:.3f} (custom calls as walked: {walked / members / 1e9:.3f})")
    print("  " + ", ".join(f"{k} {v / members / 1e9:.3f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
