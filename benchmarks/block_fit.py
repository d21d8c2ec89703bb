"""Which norm_dense (D, F) and mlp_block (D, M) shapes compile for the H200, beside the rule
(pallas_block.fits): each kernel's forward and backward compiled without a device (train/target.py).
The compiler refuses a program whose whole weight blocks and their gradients' accumulators exceed
the 227 KiB of shared memory a block may have on sm_90.

    JAX_PLATFORMS=cpu python benchmarks/block_fit.py [norm_dense:128:256 mlp_block:64:256 ...]
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

DEFAULT = (
    "norm_dense:64:256 norm_dense:128:256 norm_dense:256:256 norm_dense:128:512 norm_dense:64:1024 "
    "mlp_block:64:128 mlp_block:32:256 mlp_block:16:512 mlp_block:128:64 mlp_block:64:256 mlp_block:128:128"
).split()


def compiles(kind: str, width: int, hidden: int, rows: int = 200) -> str:
    """ "ok", or the compiler's first line, for ``kind``'s forward and backward at these sizes."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from mhjax.models import pallas_block
    from mhjax.train import target as targets

    sharding = NamedSharding(Mesh(targets.devices(targets.load("h200")), ("x",)), PartitionSpec())

    def shape(*dims, dtype=jnp.float32):
        return jax.ShapeDtypeStruct(dims, dtype, sharding=sharding)

    if kind == "norm_dense":
        args = (shape(rows, width), shape(width), shape(width, hidden), shape(hidden))

        def loss(*a):
            return jnp.sum(jnp.sin(pallas_block.norm_dense(*a, False)))
    else:
        args = (
            shape(rows, width),
            shape(width),
            shape(width, hidden),
            shape(hidden),
            shape(hidden, width),
            shape(width),
        )

        def loss(*a):  # dropout on: the kernels carry the hash
            return jnp.sum(jnp.sin(pallas_block.mlp_block(*a, jnp.zeros(2, jnp.uint32), 1 << 23, 2.0, False)))

    limits, max_dim = dict(pallas_block.MAX_ELEMENTS), pallas_block.MAX_DIM
    pallas_block.MAX_ELEMENTS.update(dict.fromkeys(limits, 1 << 30))  # the compiler decides, not the rule
    pallas_block.MAX_DIM = 1 << 15
    try:
        jax.jit(jax.grad(loss, argnums=tuple(range(len(args))))).lower(*args).compile()
        return "ok"
    except Exception as exc:  # the compiler's refusal, e.g. RESOURCE_EXHAUSTED: shared memory
        return str(exc).splitlines()[0][:140]
    finally:
        pallas_block.MAX_ELEMENTS.update(limits)
        pallas_block.MAX_DIM = max_dim


def main(specs) -> None:
    from mhjax.models import pallas_block

    for spec in specs:
        kind, width, hidden = spec.split(":")
        start = time.time()
        verdict = compiles(kind, int(width), int(hidden))
        rule = pallas_block.fits(int(width), int(hidden), kind)
        label = "F" if kind == "norm_dense" else "M"
        print(
            f"{kind:<10} D={width:<4} {label}={hidden:<5} rule: {'fits' if rule else 'XLA':<4}  "
            f"H200 compile: {verdict} ({time.time() - start:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main(sys.argv[1:] or DEFAULT)
