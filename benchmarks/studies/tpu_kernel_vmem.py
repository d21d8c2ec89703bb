"""mhjax's TPU attention kernel alone, compiled for one v5e chip without a TPU (libtpu's
compile-only devices; jax[tpu] at jax's version, JAX_PLATFORMS=cpu): what benchmarks/RESULTS.md
"TPU at any T" and docs/performance.md "VMEM and auto" were measured with.

- ``vmem``: per case T:heads:dtype, the smallest scoped VMEM limit (vmem_limit_bytes, bisected
  to 64 KiB) at which the forward, and the forward with the backward, compile, beside
  models/tpu_vmem.need's figure;
- ``compile``: compile seconds of the forward and backward at each T, the cases interleaved
  over ``--repeats`` (T = 1,021 against 1,024: the same padded kernel).

    JAX_PLATFORMS=cpu python benchmarks/studies/tpu_kernel_vmem.py vmem 1021:16:float32 8192:1:bfloat16
    JAX_PLATFORMS=cpu python benchmarks/studies/tpu_kernel_vmem.py compile 1021:1:float32 1024:1:float32
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.experimental import topologies  # noqa: E402
from jax.sharding import SingleDeviceSharding  # noqa: E402

from mhjax.models import pallas_tpu_attention, tpu_vmem  # noqa: E402
from mhjax.train import deviceless  # noqa: E402

BATCH, WIDTH, MIB = 50, 64, 2**20


def lowered(length: int, heads: int, dtype, backward: bool):
    chip = SingleDeviceSharding(topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices[0])
    qkv = jax.ShapeDtypeStruct((1, BATCH, length, 3 * WIDTH), dtype, sharding=chip)
    seeds = jax.ShapeDtypeStruct((1, heads, 2), jnp.uint32, sharding=chip)

    def loss(q, s):
        out = pallas_tpu_attention.members_attention(q, s, ((1, heads),), int(0.9 * (1 << 24)), 1 / 0.9, False)
        return jnp.sum(out.astype(jnp.float32))

    with tpu_vmem.for_chip("TPU v5 lite"):
        return jax.jit(jax.grad(loss) if backward else loss).lower(qkv, seeds)


def compiles(limit: int, length: int, heads: int, dtype, backward: bool) -> bool:
    saved = tpu_vmem.limit
    tpu_vmem.limit = lambda device_kind=None: limit  # traced under this limit
    try:
        lowered(length, heads, dtype, backward).compile()
        return True
    except Exception as exc:  # noqa: BLE001
        if not deviceless.out_of_memory(exc):
            raise
        return False
    finally:
        tpu_vmem.limit = saved


def cases(texts):
    for text in texts:
        length, heads, dtype = text.split(":")
        yield int(length), int(heads), jnp.dtype(dtype)


def vmem(texts) -> None:
    for length, heads, dtype in cases(texts):
        need = tpu_vmem.need(length, WIDTH, heads, dtype.itemsize)
        found = {}
        for call, backward in (("forward", False), ("backward", True)):
            low, high = 64 << 10, 100 * MIB
            while high - low > 64 << 10:
                middle = (low + high) // 2
                low, high = (low, middle) if compiles(middle, length, heads, dtype, backward) else (middle, high)
            found[call] = high
        print(
            f"T = {length}, {heads} heads, {dtype}: Mosaic {found['forward'] / MIB:.2f} / {found['backward'] / MIB:.2f}"
            f" MiB, need {need['forward'] / MIB:.2f} / {need['backward'] / MIB:.2f} (forward / backward)",
            flush=True,
        )


def compile_times(texts, repeats: int) -> None:
    seconds = {}
    for _ in range(repeats):
        for case in cases(texts):
            program = lowered(*case, backward=True)
            start = time.perf_counter()
            program.compile()
            seconds.setdefault(case, []).append(time.perf_counter() - start)
    for (length, heads, dtype), runs in seconds.items():
        print(f"T = {length}, {heads} heads, {dtype}: {' '.join(f'{s:.2f}' for s in runs)} s, min {min(runs):.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=("vmem", "compile"))
    parser.add_argument("cases", nargs="+", help="T:heads:dtype, e.g. 1021:16:float32")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    vmem(args.cases) if args.what == "vmem" else compile_times(args.cases, args.repeats)


if __name__ == "__main__":
    main()
