"""Which norm_dense (D, F) and mlp_block (D, M) shapes compile for the H200, beside the rule
(pallas_block.fits): each kernel's forward and backward compiled without a device (train/target.py).
The compiler refuses a program whose whole weight blocks and their gradients' accumulators exceed
the 227 KiB of shared memory a block may have on sm_90.

    JAX_PLATFORMS=cpu python benchmarks/studies/block_fit.py [--dtype bfloat16]
        [norm_dense:128:256 mlp_block:64:256 ...]

--dtype bfloat16: x and the weights in bfloat16 (the scale float32), as a bfloat16 model calls them.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

DEFAULT = (
    "norm_dense:64:256 norm_dense:128:256 norm_dense:256:256 norm_dense:128:512 norm_dense:64:1024 "
    "mlp_block:64:128 mlp_block:32:256 mlp_block:16:512 mlp_block:128:64 mlp_block:64:256 mlp_block:128:128"
).split()


def compiles(kind: str, width: int, hidden: int, rows: int = 200, dtype: str = "float32") -> str:
    """ "ok", or the compiler's first line, for ``kind``'s forward and backward at these sizes, x and
    the weights in ``dtype`` (the scale float32)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from mhjax.models import pallas_block
    from mhjax.train import target as targets

    sharding = NamedSharding(Mesh(targets.devices(targets.load("h200")), ("x",)), PartitionSpec())

    def shape(*dims, dtype=dtype):
        return jax.ShapeDtypeStruct(dims, jnp.dtype(dtype), sharding=sharding)

    scale = shape(width, dtype=jnp.float32)
    if kind == "norm_dense":
        args = (shape(rows, width), scale, shape(width, hidden), shape(hidden))

        def loss(*a):
            return jnp.sum(jnp.sin(pallas_block.norm_dense(*a, False).astype(jnp.float32)))
    else:
        args = (
            shape(rows, width),
            scale,
            shape(width, hidden),
            shape(hidden),
            shape(hidden, width),
            shape(width),
        )

        def loss(*a):  # dropout on: the kernels carry the hash
            out = pallas_block.mlp_block(*a, jnp.zeros(2, jnp.uint32), 1 << 23, 2.0, False)
            return jnp.sum(jnp.sin(out.astype(jnp.float32)))

    budgets = (pallas_block.MAX_ELEMENTS, pallas_block.MAX_ELEMENTS_BFLOAT16)
    limits, max_dim = [dict(b) for b in budgets], pallas_block.MAX_DIM
    for budget in budgets:  # the compiler decides, not the rule
        budget.update(dict.fromkeys(budget, 1 << 30))
    pallas_block.MAX_DIM = 1 << 15
    try:
        jax.jit(jax.grad(loss, argnums=tuple(range(len(args))))).lower(*args).compile()
        return "ok"
    except Exception as exc:  # the compiler's refusal, e.g. RESOURCE_EXHAUSTED: shared memory
        return str(exc).splitlines()[0][:140]
    finally:
        for budget, limit in zip(budgets, limits):
            budget.update(limit)
        pallas_block.MAX_DIM = max_dim


def main(argv) -> None:
    from mhjax.models import pallas_block

    dtype = "float32"
    if argv[:1] == ["--dtype"]:
        dtype, argv = argv[1], argv[2:]
    for spec in argv or DEFAULT:
        kind, width, hidden = spec.split(":")
        start = time.time()
        verdict = compiles(kind, int(width), int(hidden), dtype=dtype)
        rule = pallas_block.fits(int(width), int(hidden), kind, dtype)
        label = "F" if kind == "norm_dense" else "M"
        print(
            f"{kind:<10} {dtype} D={width:<4} {label}={hidden:<5} rule: {'fits' if rule else 'XLA':<4}  "
            f"H200 compile: {verdict} ({time.time() - start:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
    elif any(a.count(":") != 2 for a in sys.argv[1:] if a not in ("--dtype", "bfloat16", "float32")):
        sys.exit(print("usage: block_fit.py [--dtype bfloat16] [KIND:WIDTH:HIDDEN ...]", file=sys.stderr) or 2)
    else:
        main(sys.argv[1:])
