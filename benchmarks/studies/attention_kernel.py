"""One attention layer's core (after the Q/K/V projections, before the output one), forward
and forward + backward, on the CPU: mhjax's C++ kernel against the plain-JAX path that XLA
compiles (attention.jax_attention), for the paper's shapes (B 50, T 100, D 64, dropout 0.1)
at heads 1/4/8/16. Interleaved repetitions in one process, medians.

    python benchmarks/studies/attention_kernel.py [--reps N] [--dropout P]
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp

from mhjax.models import attention, cpu_attention


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=20)
    parser.add_argument("--dropout", type=float, default=0.1)
    args = parser.parse_args(argv)
    if not cpu_attention.available():
        raise SystemExit("the CPU attention kernel is unavailable here (no C++ compiler, or not a CPU backend)")
    batch, length, width = 50, 100, 64
    key = jax.random.PRNGKey(0)
    q, k, v = (jax.random.normal(jax.random.fold_in(key, i), (batch, length, width)) for i in range(3))
    threshold, inv_keep = attention.dropout_threshold(args.dropout) if args.dropout > 0 else (1 << 24, 1.0)
    fns = {}
    for heads in (1, 4, 8, 16):
        seeds = jax.random.bits(key, (heads, 2), jnp.uint32)
        count = jnp.full((1,), heads, jnp.int32)
        impls = {
            "kernel": lambda q, k, v, c=count, s=seeds: cpu_attention.attention(q, k, v, c, s, threshold, inv_keep),
            "xla": lambda q, k, v, h=heads, s=seeds: attention.jax_attention(q, k, v, h, None, s, threshold, inv_keep)[
                0
            ],
        }
        for name, f in impls.items():
            fns[(heads, name, "fwd")] = jax.jit(f)
            fns[(heads, name, "fwd+bwd")] = jax.jit(
                jax.grad(lambda q, k, v, f=f: jnp.sum(jnp.sin(f(q, k, v))), argnums=(0, 1, 2))
            )
    for fn in fns.values():
        jax.block_until_ready(fn(q, k, v))
    times = {key_: [] for key_ in fns}
    for _ in range(args.reps):
        for key_, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn(q, k, v))
            times[key_].append(time.perf_counter() - start)
    print(
        f"attention core, B {batch}, T {length}, D {width}, dropout {args.dropout}: "
        f"median ms over {args.reps} interleaved reps"
    )
    print(f"{'heads':>5} {'kernel fwd':>11} {'xla fwd':>9} {'kernel f+b':>11} {'xla f+b':>9} {'speed-up f+b':>13}")
    for heads in (1, 4, 8, 16):
        m = {
            (n, p): 1e3 * statistics.median(times[(heads, n, p)]) for n in ("kernel", "xla") for p in ("fwd", "fwd+bwd")
        }
        print(
            f"{heads:5d} {m['kernel', 'fwd']:11.2f} {m['xla', 'fwd']:9.2f} {m['kernel', 'fwd+bwd']:11.2f} "
            f"{m['xla', 'fwd+bwd']:9.2f} {m['xla', 'fwd+bwd'] / m['kernel', 'fwd+bwd']:12.1f}x"
        )


if __name__ == "__main__":
    main()
