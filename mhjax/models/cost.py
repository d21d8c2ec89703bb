"""What one training step of one member costs on an accelerator, per sweep strategy, and
the member-steps/s a roofline predicts from it; pure arithmetic, nothing compiled.

A member computes attention at ``fine`` heads F: its own head count H (grouped,
one_program) or the sweep's finest count (fused, ``mixed``: fine scores summed per coarse
head by an F x F einsum). Attention maps are (B, F, T, T) per layer, so F, not H, sets
their cost, and at the paper's shapes they are most of the memory traffic.

FLOPs and bytes follow XLA's own count of the compiled step on the JAX attention path
(``benchmarks/studies/cost_model.py``: HLO cost analysis of the paper model, jax 0.10): matmuls
at their full size (the causal half is computed and masked), plus per attention element
and per token-row costs measured once and stated below. Tests hold the model to XLA's
count on other shapes (tests/test_cost.py).

Roofline: a step takes max(compute time, bytes / bandwidth), per member at its head count.
Compute time prices each kind of arithmetic at the rate it runs: matmuls ("dots": the model's
projections, MLP, readout, and the attention kernel's seven dots) at the device's dot rate
(TF32 tensor cores on an H200 or H100, where XLA and the Triton lowering run fp32 dots at
their default precision; on a CPU, as in interpret mode and CI, dots are plain fp32), the
rest (softmax, masks, dropout hash, Adam) at the fp32 rate. Bytes are XLA:CPU's count, what
the terms below were fitted to, converted to the compiled GPU program's count and divided by
a bandwidth calibrated on the one device measurement (the calibration below). sweep_cost reports
per head count which of the two bounds the step.

``dtype`` (config.model.dtype): bfloat16 moves the activations' terms at 2 bytes an element and
runs dots at the device's bfloat16 rate (models/cost_dtype.py). Over N devices each device
computes its slice of the member axis, or every member of a program the devices do not divide
(models/cost_devices.py); the sweep steps at the busiest device's pace.
"""

from __future__ import annotations

from typing import NamedTuple

from mhjax.models import cost_devices, cost_dtype, cost_tpu, pallas_block, pallas_tpu_attention
from mhjax.models.cost_memory import activation_bytes
from mhjax.models.pallas_attention import KernelCost, kernel_cost


class Device(NamedTuple):
    name: str
    peak_flops: float  # FLOP/s of the step's elementwise arithmetic (fp32)
    hbm_bytes_per_s: float  # the datasheet's peak
    memory_bytes: float
    source: str
    dot_flops: float | None = None  # FLOP/s of fp32 matmuls at the default precision (None: peak_flops)
    effective_bytes_per_s: float | None = None  # calibrated bandwidth (None: hbm_bytes_per_s)
    # the compiled program's bytes per XLA:CPU byte: (the rest of the step, the JAX attention core)
    compiled_bytes: tuple[float, float] = (1.0, 1.0)
    bf16_dot_flops: float | None = None  # FLOP/s of bfloat16 matmuls (None: dot_rate's)

    def dot_rate(self, dtype: str = "float32") -> float:
        fp32 = self.dot_flops or self.peak_flops
        return (self.bf16_dot_flops or fp32) if dtype == "bfloat16" else fp32

    def bandwidth(self) -> float:
        return self.effective_bytes_per_s or self.hbm_bytes_per_s


# Calibration (issue 29). The terms below count what XLA:CPU counts; a GPU's compiled program
# fuses more and moves fewer bytes, and not in one ratio: XLA:GPU fuses the JAX attention core
# (and one_program's slices and pads around it) far better than the rest of the step. So two
# ratios, measured on the code as it is: benchmarks/studies/gpu_bytes.py (deviceless H200 compile, each
# top-level kernel of the compiled program reading its operands and writing its results once,
# the Pallas calls at kernel_cost's bytes) against benchmarks/studies/cost_model.py (XLA:CPU), paper
# config, one_program, per member-step, jax 0.10.2, 2026-12-05:
#   attention=pallas: 0.316 GB on the GPU, 0.336 GB by XLA:CPU, the kernels' 0.141 GB in both
#                     (attention, norm_dense and mlp_block; with the attention kernel alone, before
#                     the block kernels: 0.687 and 0.773 GB, the kernel's 0.063, a ratio of 0.88);
#   JAX path:         1.483 GB on the GPU, 2.453 GB by XLA:CPU, of which the rest of the step
#                     (WIDTH, MLP, VOCAB, PARAM below) 0.913 GB.
GPU_REST = (0.316 - 0.141) / (0.336 - 0.141)  # 0.90: the step around the Pallas kernels
GPU_JAX_CORE = (1.483 - GPU_REST * 0.913) / (2.453 - 0.913)  # 0.43: the JAX core with one_program's copies
# The one device measurement (benchmarks/RESULTS.md, "Cost model"): the JAX path, one_program,
# the paper sweep, 2,104 member-steps/s on an H200, so 1.483 GB x 2,104/s = 3.12 TB/s moved, 65 %
# of the 4.8 TB/s peak (the step is many small kernels). The issue's own walk of the same
# programs gave 1.56 and 0.77 GB (before items 1 and 4): 3.28 TB/s; its ratio no longer holds
# once the copies XLA:CPU charged heavily and XLA:GPU fused are gone.
H200_MEASURED = (2104.0, 1.483e9)  # (member-steps/s, compiled GPU bytes per member-step)
H200_EFFECTIVE = H200_MEASURED[0] * H200_MEASURED[1]

DEVICES = {
    # The model trains in fp32. Its matmuls run as TF32 on the tensor cores (JAX's default
    # precision for fp32 dots on NVIDIA GPUs since Ampere; the Pallas kernel's Triton dots
    # likewise); the elementwise rest on CUDA cores at the fp32 rate.
    "h200": Device(
        "NVIDIA H200 SXM",
        67e12,
        4.8e12,
        141e9,
        "NVIDIA H200 datasheet: FP32 67 TFLOP/s, TF32 Tensor Core 989 TFLOP/s with 2:4 sparsity (494.7 dense; "
        "the H100 SXM datasheet gives the same), BF16 Tensor Core 1,979 TFLOP/s with sparsity (989.5 dense), "
        "HBM3e 4.8 TB/s, 141 GB; bandwidth calibrated to 3.12 TB/s "
        "effective on 2,104 member-steps/s measured (models/cost.py, calibration)",
        dot_flops=494.7e12,
        effective_bytes_per_s=H200_EFFECTIVE,
        compiled_bytes=(GPU_REST, GPU_JAX_CORE),
        bf16_dot_flops=989.5e12,
    ),
    # XLA's fp32 matmuls: one bf16 pass at JAX's default precision; elementwise work at the vector
    # unit's rate; the kernel by unit, byte ratios and every rate's source: models/cost_tpu.py.
    "tpu-v5e": Device(
        "Google TPU v5e",
        cost_tpu.VECTOR_RATE,
        cost_tpu.HBM_BYTES_PER_S,
        16e9,
        "Cloud TPU v5e docs: 197 TFLOP/s bf16 (MXU), 819 GB/s HBM2, 16 GiB; vector unit 3.1 TFLOP/s derived, "
        "grid steps 0.35 us (models/cost_tpu.py); bytes calibrated to the TPU compiler's program on the paper "
        "sweep only, bandwidth not (no TPU measurement)",
        dot_flops=cost_tpu.MXU_BF16,
        compiled_bytes=cost_tpu.COMPILED_BYTES,
    ),
}
BACKEND_DEVICE = {"gpu": "h200", "cuda": "h200", "rocm": "h200", "tpu": "tpu-v5e"}  # the preset `auto` assumes

# XLA's count of the paper model's step (jax 0.10, CPU compile of the JAX attention path),
# fitted over one-member programs varying one of T, F, D, MLP, V, B or L at a time and the
# tiny test config for the per-parameter terms; (FLOPs, bytes) per unit named.
ATTENTION = (28.0, 91.4)  # per (b, f, t, s) score element per layer: softmax, mask, dropout, grads
SCORE_ROW = (23.0, 8.0)  # per (b, t, s) per layer, whatever F: the mask and index arithmetic
MIXING = (4.0, 44.0)  # fused only, per score element per layer (FLOPs also x F: the F x F einsum)
WIDTH, MLP, VOCAB = (127.0, 512.0), (6.4, 58.6), (8.4, 70.6)  # per (b, t) row and unit of D, MLP (per layer), V
PARAM = (38.0, 99.0)  # per parameter: Adam, the divergence check, gradients
# Under the Pallas kernels (attention, the norm-and-projection and the MLP block; issue 29), what
# XLA still counts around them, with VOCAB and PARAM as they are: per (b, t) row and unit of D per
# layer (the output projection, the residual adds, the gradient sums; WIDTH and MLP cover the
# unfused block), and per parameter of the block kernels (q/k/v, MLP, norm scales) less what
# XLA no longer does for it (its weight gradient comes out of the kernel as partials, counted in
# the kernel's bytes). Fitted on XLA's count of one_program:pallas, the kernels opaque
# (benchmarks/studies/hlo_cost.py), on the paper sweep (8 seeds: 0.194 GB and 1.00 GFLOP per member-step
# besides the kernels) and the tiny test config; a third shape (width 32, 2 layers, T 40, MLP
# 64, vocab 64, batch 16) is within 6 % of the total.
KERNEL_WIDTH = (4.4, 70.9)
KERNEL_PARAM = (-9.3, -32.6)
# The same with the attention kernel alone (a width or MLP too large for pallas_block's whole
# weight blocks: the block's norms and MLP unfused): WIDTH less what the kernel reads and writes
# in place that the JAX path copies. Fitted on the paper sweep before the block kernels: 0.773 GB.
ATTENTION_KERNEL_WIDTH = (-26.5, -158.0)


# Scanned layers under the kernels (config.model.scan_layers=on; auto does not scan on a GPU): each layer's
# saved activations copied into stacks in the forward and out in the backward, the stacks zeroed;
# in the compiled GPU program's bytes per (b, t) row and unit of D per layer (gpu_bytes.py, paper
# sweep, 8 members, one_program: 0.497 GB per member-step scanned against 0.316 unrolled).
SCAN_KERNEL_WIDTH = (0.497 - 0.316) * 1e9 / (4 * 50 * 100 * 64)  # 141 bytes


class Shape(NamedTuple):
    batch: int
    length: int
    width: int
    num_layers: int
    mlp_dim: int
    vocab: int
    attention_width: int | None = None  # q, k and v's width A = heads x head size; None: the width

    @classmethod
    def of(cls, config, model=None) -> Shape:
        """From a config; ``model``: a ModelConfig whose sizes replace the config's (a shape group's)."""
        m = config.model
        if model is None:
            return cls(config.data.batch_size, m.seq_len, m.width, m.num_layers, m.mlp_dim, m.vocab_size)
        sizes = (model.width, model.num_layers, model.mlp_dim, m.vocab_size, model.attention_width)
        return cls(config.data.batch_size, m.seq_len, *sizes)

    @property
    def attention(self) -> int:
        return self.attention_width or self.width

    def params(self) -> int:
        d, m, v, a = self.width, self.mlp_dim, self.vocab, self.attention
        block = 3 * (d * a + a) + (a * d + d) + (d * m + m) + (m * d + d) + 2 * d
        return v * d + self.length * d + self.num_layers * block + d * v + v


class Cost(NamedTuple):
    """Per member-step. ``bytes`` is XLA:CPU's count; of it ``core_bytes`` are the JAX
    attention core's and ``kernel_bytes`` the Pallas kernel's (exact, counted analytically);
    of ``flops``, ``dot_flops`` are matmuls. ``scan_bytes``: beside ``bytes``, what scanned
    layers add on a GPU (XLA:CPU counts a loop body once and cannot see it). ``dtype``: the
    compute dtype priced (models/cost_dtype.py), whose dot rate ``times`` uses."""

    flops: float
    bytes: float
    dot_flops: float = 0.0
    core_bytes: float = 0.0
    kernel_bytes: float = 0.0
    scan_bytes: float = 0.0  # the scanned layers' stack copies, in the compiled GPU program's bytes
    dtype: str = "float32"
    kernel_time: tuple = ()  # the TPU kernel's seconds by unit (cost_tpu.KernelTime), priced instead of
    kernel_flops: tuple = (0.0, 0.0)  # its (dot, all) FLOPs within flops and dot_flops


def member_cost(shape: Shape, fine: int, mixed: bool = False, kernel: bool = False, dtype: str = "float32") -> Cost:
    """One member's training step with attention at ``fine`` heads (``mixed``: the fused
    program's summed fine scores; ``kernel``: the attention core in the Pallas kernel,
    pallas_attention.kernel_cost, at static head counts only, so not with ``mixed``) in the
    compute ``dtype`` (models/cost_dtype.py: the activation terms, third in each count, scaled)."""
    b, t, d, layers, m, v = shape[:6]
    a, half = shape.attention, cost_dtype.activation_factor(dtype)
    kernel = False if mixed else kernel
    if kernel == "tpu":  # mhjax's TPU kernel; the block's norms and MLP as XLA runs them
        priced = _attention_kernel_cost(shape, fine, dtype, pallas_tpu_attention.kernel_cost)
        k = pallas_tpu_attention.kernel_cost(b, t, a, fine, cost_dtype.element_bytes(dtype))
        seconds = cost_tpu.kernel_time(b, t, a, fine, dtype).scaled(layers)
        return priced._replace(kernel_time=seconds, kernel_flops=(layers * k.dot_flops, layers * k.flops))
    if kernel and not all(pallas_block.block_parts(d, m, a, dtype)):
        return _attention_kernel_cost(shape, fine, dtype)
    if kernel:  # XLA's matmuls: the output projection and the readout; the kernels count their own
        matmul = 3 * 2 * b * t * (layers * a * d + d * v)  # forward + 2x backward
        block_params = layers * (3 * (d * a + a) + 2 * d * m + m + d + 2 * d)
        counts = [
            (KERNEL_WIDTH, layers * b * t * d, half),
            (KERNEL_PARAM, block_params, 1.0),
            (VOCAB, b * t * v, 1.0),
            (PARAM, shape.params(), 1.0),
        ]
        k = kernels_cost(shape, fine, dtype)
        kernel_bytes = layers * k.bytes
        flops, dots = matmul + _flops(counts) + layers * k.flops, matmul + layers * k.dot_flops
        return Cost(flops, _bytes(counts) + kernel_bytes, dots, 0.0, kernel_bytes, dtype=dtype)
    matmul = 3 * 2 * b * t * (layers * (4 * d * a + 2 * d * m + 2 * t * a) + d * v)  # forward + 2x backward
    scores, elements = layers * b * t * t, layers * b * fine * t * t
    counts = [
        (WIDTH, layers * b * t * d, half),
        (MLP, layers * b * t * m, half),
        (VOCAB, b * t * v, 1.0),
        (PARAM, shape.params(), 1.0),
    ]
    core = [(ATTENTION, elements, 1.0), (SCORE_ROW, scores, 1.0)]
    if mixed:
        core.append(((MIXING[0] * fine, MIXING[1]), elements, 1.0))
    core_bytes = _bytes(core)
    return Cost(matmul + _flops(counts + core), _bytes(counts) + core_bytes, matmul, core_bytes, dtype=dtype)


def _flops(counts) -> float:
    return sum(c[0] * n for c, n, _ in counts)


def _bytes(counts) -> float:
    return sum(c[1] * n * scale for c, n, scale in counts)


def _attention_kernel_cost(shape: Shape, heads: int, dtype: str = "float32", counted=kernel_cost) -> Cost:
    """member_cost under the attention kernel alone (``counted``: its cost, the GPU's or the
    TPU's), the block's norms and MLP as XLA runs them."""
    b, t, d, layers, m, v = shape[:6]
    a, half = shape.attention, cost_dtype.activation_factor(dtype)
    matmul = 3 * 2 * b * t * (layers * (4 * d * a + 2 * d * m) + d * v)
    counts = [
        (WIDTH, layers * b * t * d, half),
        (ATTENTION_KERNEL_WIDTH, layers * b * t * d, half),
        (MLP, layers * b * t * m, half),
        (VOCAB, b * t * v, 1.0),
        (PARAM, shape.params(), 1.0),
    ]
    k = counted(b, t, a, heads, cost_dtype.element_bytes(dtype))
    kernel_bytes = layers * k.bytes
    flops = matmul + _flops(counts) + layers * k.flops
    return Cost(flops, _bytes(counts) + kernel_bytes, matmul + layers * k.dot_flops, 0.0, kernel_bytes, dtype=dtype)


def kernels_cost(shape: Shape, heads: int, dtype: str = "float32") -> KernelCost:
    """One layer's Pallas kernels, forward and backward, for a member at ``heads``: attention
    (pallas_attention.kernel_cost) and the block's parts that run as kernels
    (pallas_block.block_parts: the norm and q/k/v projection, the MLP block), their rows and
    weights read in ``dtype`` (the kernels' ``itemsize``). member_cost uses it
    where both block kernels run (pallas_block.fits: within one program's shared memory), else the attention kernel's
    terms alone (a model where only one of the two runs is priced that way too: an
    approximation)."""
    b, t, d, _, m, _ = shape[:6]
    a, size = shape.attention, cost_dtype.element_bytes(dtype)
    norm, mlp = pallas_block.block_parts(d, m, a, dtype)
    parts = [kernel_cost(b, t, a, heads, size)]
    parts += [pallas_block.norm_dense_cost(b * t, d, 3 * a, size)] if norm else []
    parts += [pallas_block.mlp_block_cost(b * t, d, m, size)] if mlp else []
    return KernelCost(*(sum(column) for column in zip(*parts)))


def device_bytes(cost: Cost, device: Device) -> float:
    """``cost``'s bytes as the device's compiled program moves them (Device.compiled_bytes)."""
    rest, core = device.compiled_bytes
    rest_bytes = cost.bytes - cost.core_bytes - cost.kernel_bytes
    return rest_bytes * rest + cost.core_bytes * core + cost.kernel_bytes + cost.scan_bytes


def times(cost: Cost, device: Device) -> tuple[float, float]:
    """(compute seconds, memory seconds) of a step (terms: compute is the first three's sum)."""
    parts = terms(cost, device)
    return sum(parts[:3]), parts[3]


def terms(cost: Cost, device: Device) -> tuple[float, float, float, float]:
    """(matmul, other arithmetic, grid step, memory) seconds of a step: dots at the dot rate of
    the cost's dtype, the rest at the fp32 rate, the TPU kernel by unit (cost_tpu.KernelTime),
    bytes at the calibrated bandwidth."""
    dots, flops = cost.kernel_flops
    kernel = cost.kernel_time or (0.0, 0.0, 0.0)
    matmul = (cost.dot_flops - dots) / device.dot_rate(cost.dtype) + kernel[0]
    other = (cost.flops - cost.dot_flops - (flops - dots)) / device.peak_flops + kernel[1]
    return matmul, other, kernel[2], device_bytes(cost, device) / device.bandwidth()


def step_seconds(cost: Cost, device: Device) -> float:
    return max(times(cost, device))


def sweep_cost(
    shape: Shape | list[Shape],
    programs,
    device: Device,
    devices: int = 1,
    kernel: bool = False,
    scanned: bool = False,
    dtype: str = "float32",
) -> dict:
    """Predicted figures of a sweep whose programs run one after another.

    ``programs``: per program, its groups as (members, fine heads, mixed), in member-axis order.
    Over ``devices``, each computes its slice of a program's members where they divide it,
    else every member (placement.py); the sweep steps at the busiest device's pace
    (models/cost_devices.py). Returns per member-step FLOPs and bytes (XLA:CPU's count and the
    device's compiled program's, averaged over members), member-steps/s of the whole sweep, the
    memory of the fullest device (states of its members, activations of its largest program;
    ``dtype`` for activations, float32 states), ``per_device`` (cost_devices.summary) and, per fine
    head count, the step's compute and memory seconds and which bounds it. ``kernel``: static
    head counts run the Pallas kernel (True: the GPU's, "tpu": the TPU's). ``scanned``: the
    layers run as one scanned block (SCAN_KERNEL_WIDTH, priced under the GPU kernels only: the
    JAX path is not scanned on a GPU; on a TPU the calibration holds the scan).
    ``shape``: every program's, or a list of one per program (programs of other sizes: a sweep
    over architecture fields, experiments/architecture.py). ``dtype``: the compute dtype
    (models/cost_dtype.py).
    """
    members = sum(n for groups in programs for n, _, _ in groups)
    flops = nbytes = compiled = dots = rest = 0.0
    shapes = shape if isinstance(shape, list) else [shape] * len(programs)
    loads, replicated, bound = [cost_devices.Load() for _ in range(max(devices, 1))], [], {}
    for index, (shape, groups) in enumerate(zip(shapes, programs)):
        priced = {}
        for n, fine, mixed in groups:
            cost = member_cost(shape, fine, mixed, kernel, dtype)
            if scanned and kernel and kernel != "tpu" and not mixed:  # the GPU kernels' scan (measured there)
                scan = SCAN_KERNEL_WIDTH * shape.num_layers * shape.batch * shape.length * shape.width
                cost = cost._replace(scan_bytes=scan * cost_dtype.activation_factor(dtype))
            flops, nbytes = flops + n * cost.flops, nbytes + n * cost.bytes
            compiled, dots = compiled + n * device_bytes(cost, device), dots + n * cost.dot_flops
            rest += n * (cost.bytes - cost.core_bytes - cost.kernel_bytes)
            compute, memory = times(cost, device)
            bound[fine] = {"compute_s": compute, "memory_s": memory}
            bound[fine]["bound"] = cost_tpu.bound(terms(cost, device), bool(cost.kernel_time))
            if cost.kernel_time:  # the TPU's terms, each named
                bound[fine].update(zip(("matmul_s", "vector_s", "grid_s"), terms(cost, device)[:3]))
            acts = activation_bytes(shape, fine, False if mixed else kernel, dtype)
            priced[(fine, mixed)] = (max(compute, memory), cost.flops, device_bytes(cost, device), acts)
        if devices > 1 and sum(n for n, _, _ in groups) % devices:
            replicated.append(index)
        for load, mine in zip(loads, cost_devices.device_groups(groups, devices)):
            rows = [(n, *priced[(fine, mixed)]) for n, fine, mixed in mine]
            load.add(rows, 16.0 * shape.params(), cost_devices.CHECKPOINT_BYTES_PER_PARAM * shape.params())
    per_device = cost_devices.summary(loads, replicated)
    return {
        "flops_per_member_step": flops / members,
        "dot_flops_per_member_step": dots / members,
        "bytes_per_member_step": nbytes / members,
        "rest_bytes_per_member_step": rest / members,  # of bytes, neither the JAX core's nor the kernel's
        "compiled_bytes_per_member_step": compiled / members,
        "member_steps_per_s": members / per_device["seconds_per_step"],
        "memory_per_device_bytes": max(load.memory for load in loads),
        "per_device": per_device,
        "dtype": dtype,
        "bound_by_heads": dict(sorted(bound.items())),
    }


def prediction_text(p: dict, member_steps: int) -> str:
    """A prediction's figures: rate, time for the sweep's member-steps, traffic (XLA:CPU's
    count and the compiled program's, models/cost.py), FLOPs as priced (every FLOP, elementwise
    and the kernels' recomputation too, so not the member table's analytic matmuls of
    models/flops.py), memory, what bounds each head count."""
    bound = ", ".join(f"{h} {b['bound']}" for h, b in p["bound_by_heads"].items())
    return (
        f"~{p['member_steps_per_s']:,.0f} member-steps/s, ~{_seconds_text(member_steps / p['member_steps_per_s'])} of "
        f"training without compiles, {p['bytes_per_member_step'] / 1e9:.2f} GB "
        f"({p['compiled_bytes_per_member_step'] / 1e9:.2f} compiled for {p['device'].name}) and "
        f"{p['flops_per_member_step'] / 1e9:.2f} GFLOP per member-step as priced (every FLOP the program runs, "
        f"the kernels' recomputation included; {p['dot_flops_per_member_step'] / 1e9:.2f} of them in matmuls), "
        f"~{p['memory_per_device_bytes'] / 2**30:.2f} GiB per device; bound by heads: {bound}"
    )


def _seconds_text(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:,.0f} s"
