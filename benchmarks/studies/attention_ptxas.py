"""Registers and spills of the Pallas attention kernels for sm_90, from the deviceless compile.

Compiles the gradient of pallas_attention.members_attention (forward and backward kernels, with
dropout: the hash's integer temporaries are the worst case) for the H200 target on this CPU
(train/target.py), dumps the module's PTX (XLA_FLAGS=--xla_dump_to) and runs the CUDA wheel's
ptxas -v on it: registers per thread, stack frame and spill bytes per kernel. With --sweep,
also tile/warp choices beside the library's rule (pallas_attention.block_sizes), which is how
the rule was chosen: no spill at any head dim.

    JAX_PLATFORMS=cpu /work/venv-gpu/bin/python benchmarks/studies/attention_ptxas.py [--sweep]
        [--lengths 100,1024] [--head-dims 4,8,16,32,64,128] [--dtype bfloat16]

--dtype bfloat16: the kernels on a bfloat16 projection (config.model.dtype=bfloat16).
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

WIDTH = 64  # the paper's width: heads = WIDTH / head dim (beyond 64: one head of that width)


def _ptxas() -> str:
    import nvidia  # the CUDA wheels' namespace (jax[cuda13])

    for root in nvidia.__path__:
        found = glob.glob(os.path.join(root, "*", "bin", "ptxas"))
        if found:
            return found[0]
    raise SystemExit("no ptxas in the nvidia wheels: pip install 'jax[cuda13]'")


def compile_once(length: int, head_dim: int, dtype: str = "float32") -> None:
    """The kernels' forward and backward at (B = 2, T = length, one member of WIDTH / head_dim
    heads of ``head_dim``, the projection in ``dtype``), compiled for the H200 (the module dumped
    where XLA_FLAGS says)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from mhjax.models import pallas_attention
    from mhjax.train import target as targets

    width = max(WIDTH, head_dim)
    heads = width // head_dim
    sharding = NamedSharding(Mesh(targets.devices(targets.load("h200")), ("x",)), PartitionSpec())

    def loss(qkv, seeds):  # threshold 2^23: dropout 0.5, so the kernels carry the hash
        out = pallas_attention.members_attention(qkv, seeds, ((1, heads),), 1 << 23, 2.0, False)
        return jnp.sum(jnp.sin(out.astype(jnp.float32)))

    qkv = jax.ShapeDtypeStruct((1, 2, length, 3 * width), jnp.dtype(dtype), sharding=sharding)
    seeds = jax.ShapeDtypeStruct((1, heads, 2), jnp.uint32, sharding=sharding)
    jax.jit(jax.grad(loss)).lower(qkv, seeds).compile()


def report(paths) -> dict:
    """{kernel: (registers, stack bytes, spill store bytes, spill load bytes)} of the PTX files."""
    out = {}
    for path in paths:
        text = subprocess.run(
            [_ptxas(), "-v", "--gpu-name", "sm_90a", path, "-o", os.devnull], capture_output=True, text=True
        ).stderr
        for name, body in re.findall(
            r"Compiling entry function '(mhjax_attention_\w+)'.*?\n(.*?Used \d+ registers)", text, re.S
        ):
            frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", body)
            registers = int(re.search(r"Used (\d+) registers", body).group(1))
            out[name] = (registers, *map(int, frame.groups()))
    return out


# (forward tile, backward tile, warps) tried beside the rule (--sweep)
SWEEP = ((128, 64, 4), (128, 64, 8), (64, 64, 8), (64, 32, 4), (64, 32, 8), (32, 16, 8))


def _line(length, head_dim, blocks, stages, figures) -> str:
    tiles = f"tiles {blocks.forward}/{blocks.backward} x {blocks.cols}"
    cells = [f"T {length:>5}, head dim {head_dim:>3}, {tiles}, {blocks.warps} warps, {stages} stages"]
    for name in ("mhjax_attention_fwd", "mhjax_attention_bwd"):
        r, frame, stores, loads = figures.get(name, (0, 0, 0, 0))
        cells.append(f"{name[-3:]}: {r} registers, {stores} B spill stores, {loads} B spill loads, {frame} B stack")
    return "; ".join(cells)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="100,1024")
    parser.add_argument("--head-dims", default="4,8,16,32,64,128")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the projection's")
    parser.add_argument(
        "--sweep", action="store_true", help="also other tiles and warps (SWEEP: 6 compiles per head dim)"
    )
    args = parser.parse_args(argv)
    # before jax is imported anywhere: XLA reads XLA_FLAGS once per process, so every compile
    # dumps under one root and each measurement reads the files it added
    root = tempfile.mkdtemp(prefix="attention_ptxas_")
    os.environ["XLA_FLAGS"] = f"--xla_dump_to={root}"
    from mhjax.models import pallas_attention as pa

    def run(length, head_dim, rule=None, stages=None):
        """Compile and report at one shape under ``rule`` (a TILE_RULE row for every width)."""
        before = set(glob.glob(os.path.join(root, "*")))
        saved = pa.TILE_RULE, pa.NUM_STAGES
        pa.TILE_RULE = ((None, *rule),) if rule else pa.TILE_RULE
        pa.NUM_STAGES = stages or pa.NUM_STAGES
        try:
            blocks, used = pa.block_sizes(length, head_dim), pa.NUM_STAGES
            compile_once(length, head_dim, args.dtype)
        finally:
            pa.TILE_RULE, pa.NUM_STAGES = saved
        added = set(glob.glob(os.path.join(root, "*.ptx"))) - before
        print(_line(length, head_dim, blocks, used, report(added)), flush=True)

    lengths = [int(t) for t in args.lengths.split(",")]
    dims = [int(d) for d in args.head_dims.split(",")]
    print(f"the rule (pallas_attention.block_sizes), {args.dtype}:")
    for length in lengths:
        for head_dim in dims:
            run(length, head_dim)
    if args.sweep:
        print("other tiles and warps (T = the longest length):")
        for head_dim in dims:
            for rule in SWEEP:
                run(max(lengths), head_dim, rule)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
