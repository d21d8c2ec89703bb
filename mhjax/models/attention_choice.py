"""config.attention resolved once: what computes the attention core on a backend, and why.

Every implementation computes the same function (tested); they differ in speed and in where
they run:
- "cpu_kernel", the fused C++ kernel (cpu_attention.py): a CPU with a C++ compiler; the head
  count is a runtime argument, so traced head counts (fused) use it too;
- "pallas", the fused Pallas kernel (pallas_attention.py): a GPU (Triton), or a CPU in the
  kernel's interpret mode; static head counts only, any sequence length (tiled: flash
  attention, memory linear in T);
- "pallas_tpu", the fused Pallas kernel for TPUs (pallas_tpu_attention.py, Mosaic): what
  config.attention "pallas" runs on a TPU; static head counts only, any sequence length,
  dropout included;
- "jax", plain JAX einsums: everywhere.
"auto" (the default, experiments/sequence_config.py DEFAULTS): the C++ kernel on a CPU (faster
than XLA's batched matmuls at every head dim, benchmarks/RESULTS.md) when it builds, the Pallas
kernel on a GPU (any sequence length), the Pallas TPU kernel on a TPU (dropout included), JAX
else; the planner takes JAX instead where the backend's kernel does not fit the sweep (the TPU
kernel's VMEM, models/tpu_vmem.py) or failed to compile there (plan/attention.py). ``pallas`` on a
TPU where the kernel does not fit VMEM is refused here, with what would fit. Under model.dtype=bfloat16 too: the Pallas
kernels read bfloat16 (float32 accumulation inside); the C++ kernel is float32, cast at its
boundary (models/precision.py), and on a CPU so cast still beats the JAX path in bfloat16 (1.1x
to 1.5x, docs/bfloat16.md).

The backend is an argument, not this process's: resolving for a target ("gpu") from a CPU
machine gives what that target runs (interpret=False), e.g. to compile for it ahead of time.
"""

from __future__ import annotations

import dataclasses

from mhjax.config import ConfigError
from mhjax.models import tpu_vmem

AUTO = "auto"
IMPLEMENTATIONS = (AUTO, "jax", "cpu_kernel", "pallas")
KERNELS = ("pallas", "pallas_tpu")  # the Pallas implementations: static head counts only
_PLATFORMS = {"cuda": "gpu", "rocm": "gpu"}  # jax platform names -> backend names


@dataclasses.dataclass(frozen=True)
class AttentionChoice:
    """What runs the attention core, and why.

    requested: config.attention; backend: the backend resolved for ("cpu", "gpu", "tpu");
    implementation: "jax", "cpu_kernel", "pallas" or "pallas_tpu", for static head counts (``core`` says what
    a traced head count runs); interpret: run the Pallas kernel in interpret mode (its static
    argument; True on a CPU); fallback: why "auto" did not take its kernel (None if it did or
    was not asked); reason: the whole decision in words."""

    requested: str
    backend: str
    implementation: str
    interpret: bool = False
    fallback: str | None = None
    reason: str = ""

    def core(self, traced_heads: bool) -> str:
        """The implementation a model with a traced head count (``traced_heads``) runs."""
        return core_for(self.implementation, traced_heads)


JAX = AttentionChoice("jax", "any", "jax", reason="plain JAX, asked for")  # what a model runs unless told


def core_for(implementation: str, traced_heads: bool) -> str:
    """The one place of the rule: the Pallas kernels serve static head counts only, so a traced
    head count (the fused strategy over several head counts) keeps the JAX path; the C++ kernel
    takes head counts at run time and serves both."""
    return "jax" if implementation in KERNELS and traced_heads else implementation


def backend_name(backend: str) -> str:
    """A jax backend or platform name as a backend: "cuda" and "rocm" are "gpu"."""
    return _PLATFORMS.get(backend, backend)


def resolve_attention(
    requested: str, backend: str, seq_len: int, dropout: float = 0.0, kernel_shapes=(), itemsize: int = 4
) -> AttentionChoice:
    """What ``config.attention = requested`` runs on ``backend`` (this process's or a target's)
    for sequences of ``seq_len`` under attention dropout ``dropout`` (config.model.dropout).
    ``kernel_shapes``: the (attention width, heads) the TPU kernel would run, q/k/v of
    ``itemsize`` bytes: where it would not fit the chip's VMEM (models/tpu_vmem.py), ``pallas``
    on a TPU is refused (auto's fallback for the same reason: plan/attention.py).
    An implementation that cannot run there: ConfigError naming config.attention and what can."""
    from mhjax.models import cpu_attention  # the C++ kernel builds on first use

    backend = backend_name(backend)

    def choice(implementation: str, reason: str, fallback: str | None = None) -> AttentionChoice:
        interpret = implementation == "pallas" and backend == "cpu"
        return AttentionChoice(requested, backend, implementation, interpret, fallback, reason)

    if requested == AUTO:
        if backend == "cpu":
            if cpu_attention.available():
                return choice("cpu_kernel", "auto on cpu: the C++ kernel")
            return choice("jax", "auto on cpu: JAX", "the C++ kernel is unavailable (see its warning)")
        if backend == "gpu":
            return choice("pallas", "auto on gpu: the Pallas kernel")
        if backend == "tpu":  # where it fits VMEM: the planner's check (plan/attention.KERNEL_FITS)
            return choice("pallas_tpu", "auto on tpu: the Pallas TPU kernel")
        return choice("jax", f"auto on {backend}: JAX (no kernel for {backend})")
    if requested not in IMPLEMENTATIONS:
        raise ConfigError(f"config.attention: must be one of {', '.join(IMPLEMENTATIONS)}; got {requested!r}")
    if requested == "cpu_kernel" and not (backend == "cpu" and cpu_attention.available()):
        raise ConfigError(
            f"config.attention: cpu_kernel runs on a CPU with a C++ compiler (here: backend {backend}); "
            "use auto, jax or pallas"
        )
    if requested == "pallas" and backend == "tpu":
        refused = tpu_vmem.refusal(seq_len, kernel_shapes, itemsize)
        if refused:
            raise ConfigError(f"config.attention: pallas on tpu: {refused}; use auto or jax")
        return choice("pallas_tpu", "pallas on tpu: the Pallas TPU kernel, asked for")
    if requested == "pallas" and backend not in ("cpu", "gpu"):
        raise ConfigError(
            f"config.attention: pallas runs on a GPU or a TPU (or a CPU, interpreted); here: backend {backend}; "
            "use auto or jax"
        )
    interpreted = " in interpret mode" if requested == "pallas" and backend == "cpu" else ""
    return choice(requested, f"{requested} on {backend}{interpreted}, asked for")
