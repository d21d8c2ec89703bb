"""The fused CPU attention kernel (_attention_cpu.cc): build, load, and call it from JAX.

The C++ file is compiled on first use with the system's C++ compiler (g++ or c++, or
$CXX) against the XLA FFI headers that jaxlib ships, into a per-user cache keyed by the
source, the jaxlib version and the CPU's instruction set, so `-march=native` is safe.
Nothing is built at install time; without a compiler (or with MHJAX_CPU_KERNEL=0) the
model falls back to the pure-JAX attention, which computes the same function (tested).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np

from mhjax.cache_dir import cache_root

SOURCE = Path(__file__).with_name("_attention_cpu.cc")
FORWARD, BACKWARD = "mhjax_attention_fwd", "mhjax_attention_bwd"


def _cpu_signature() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    import platform

    return platform.machine() + platform.processor()


def _cache_dir() -> Path:
    return Path(cache_root())


def _flags() -> list[str]:
    # -ffast-math without its crtfastmath.o (which would set flush-to-zero for the whole process)
    return [
        "-O3",
        "-march=native",
        "-ffp-contract=fast",
        "-fno-math-errno",
        "-fno-trapping-math",
        "-fno-signed-zeros",
        "-fassociative-math",
        "-ffinite-math-only",
        "-std=c++17",
        "-shared",
        "-fPIC",
    ]


def _compiler() -> str | None:
    for name in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def build(verbose: bool = False) -> Path:
    """Compile the kernel (once per source/jaxlib/CPU) and return the shared library path."""
    cxx = _compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler found (set CXX)")
    include = jax.ffi.include_dir()
    tag = hashlib.sha256(
        "\0".join([SOURCE.read_text(), jaxlib.__version__, _cpu_signature(), cxx, *_flags()]).encode()
    ).hexdigest()[:16]
    out = _cache_dir() / f"attention_cpu_{tag}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        target = Path(tmp) / out.name
        cmd = [cxx, *_flags(), f"-I{include}", str(SOURCE), "-o", str(target)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the CPU attention kernel failed:\n{' '.join(cmd)}\n{result.stderr[-4000:]}")
        if verbose:
            print(" ".join(cmd))
        os.replace(target, out)  # atomic: concurrent builders race harmlessly
    return out


@functools.lru_cache(maxsize=None)
def available() -> bool:
    """True once the kernel is built and registered for the CPU platform."""
    if os.environ.get("MHJAX_CPU_KERNEL", "1") in ("0", "false", "no", "off"):
        return False
    try:
        lib = ctypes.cdll.LoadLibrary(str(build()))
        for name, symbol in ((FORWARD, lib.MhjaxAttentionForward), (BACKWARD, lib.MhjaxAttentionBackward)):
            jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(symbol), platform="cpu")
            jax.ffi.register_ffi_target_as_batch_partitionable(name)
        return True
    except Exception as err:  # noqa: BLE001 - any failure means: use the JAX path
        warnings.warn(f"mhjax: CPU attention kernel unavailable, using the JAX attention ({err})", stacklevel=2)
        return False


def _attrs(threshold: int, inv_keep: float) -> dict:
    return {"threshold": np.int64(threshold), "inv_keep": np.float32(inv_keep)}


def _require():
    if not available():
        raise RuntimeError("the mhjax CPU attention kernel is unavailable (see the warning above)")


def _forward(q, k, v, heads, seeds, threshold, inv_keep):
    _require()
    lse_shape = q.shape[:-2] + (seeds.shape[-2], q.shape[-2])
    out_types = (jax.ShapeDtypeStruct(q.shape, jnp.float32), jax.ShapeDtypeStruct(lse_shape, jnp.float32))
    call = jax.ffi.ffi_call(FORWARD, out_types, vmap_method="broadcast_all")
    return call(q, k, v, heads, seeds, **_attrs(threshold, inv_keep))


def _backward(q, k, v, out, lse, dout, heads, seeds, threshold, inv_keep):
    _require()
    out_types = tuple(jax.ShapeDtypeStruct(q.shape, jnp.float32) for _ in range(3))
    call = jax.ffi.ffi_call(BACKWARD, out_types, vmap_method="broadcast_all")
    return call(q, k, v, out, lse, dout, heads, seeds, **_attrs(threshold, inv_keep))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def attention(q, k, v, heads, seeds, threshold: int, inv_keep: float):
    """Causal attention of (B, T, D) float32 q/k/v with ``heads`` ((1,) int32, may differ
    per vmapped member) heads of dim D/heads; ``seeds`` (F, 2) uint32 are the dropout seeds
    of coarse heads 0..F-1 (F >= heads). Returns (B, T, D) before the output projection."""
    return _forward(q, k, v, heads, seeds, threshold, inv_keep)[0]


def _attention_fwd(q, k, v, heads, seeds, threshold, inv_keep):
    out, lse = _forward(q, k, v, heads, seeds, threshold, inv_keep)
    return out, (q, k, v, heads, seeds, out, lse)


def _attention_bwd(threshold, inv_keep, residuals, dout):
    q, k, v, heads, seeds, out, lse = residuals
    dq, dk, dv = _backward(q, k, v, out, lse, dout, heads, seeds, threshold, inv_keep)
    zero_int = lambda x: np.zeros(x.shape, jax.dtypes.float0)  # noqa: E731
    return dq, dk, dv, zero_int(heads), zero_int(seeds)


attention.defvjp(_attention_fwd, _attention_bwd)
