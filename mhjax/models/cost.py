"""What one training step of one member costs on an accelerator, per sweep strategy, and
the member-steps/s a roofline predicts from it; pure arithmetic, nothing compiled.

A member computes attention at ``fine`` heads F: its own head count H (grouped,
one_program) or the sweep's finest count (fused, ``mixed``: fine scores summed per coarse
head by an F x F einsum). Attention maps are (B, F, T, T) per layer, so F, not H, sets
their cost, and at the paper's shapes they are most of the memory traffic.

FLOPs and bytes follow XLA's own count of the compiled step on the JAX attention path
(``benchmarks/cost_model.py``: HLO cost analysis of the paper model, jax 0.10): matmuls
at their full size (the causal half is computed and masked), plus per attention element
and per token-row costs measured once and stated below. Tests hold the model to XLA's
count on other shapes (tests/test_cost.py).

Roofline: a step takes max(FLOPs / peak, bytes / bandwidth). At these shapes a step does
~3 FLOPs per byte, far below either device's ridge point (H200: 14, v5e: 240), so the
prediction is set by memory bandwidth and the FLOP/s figure hardly matters.
"""

from __future__ import annotations

from typing import NamedTuple

from mhjax.models.pallas_attention import kernel_cost


class Device(NamedTuple):
    name: str
    peak_flops: float  # FLOP/s the step's arithmetic can reach
    hbm_bytes_per_s: float
    memory_bytes: float
    source: str


DEVICES = {
    # fp32 on CUDA cores: the model trains in fp32 and most of its FLOPs are elementwise
    # (softmax, masks, Adam), which never reach the tensor cores (989 TFLOP/s dense bf16,
    # 495 TF32). Memory-bound either way (see above).
    "h200": Device(
        "NVIDIA H200 SXM", 67e12, 4.8e12, 141e9, "NVIDIA H200 datasheet: FP32 67 TFLOP/s, HBM3e 4.8 TB/s, 141 GB"
    ),
    # TPUs run fp32 matmuls as bf16 passes at JAX's default precision, so the bf16 MXU peak.
    "tpu-v5e": Device(
        "Google TPU v5e", 197e12, 819e9, 16e9, "Cloud TPU v5e docs: 197 TFLOP/s bf16, 819 GB/s HBM2, 16 GiB"
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


class Shape(NamedTuple):
    batch: int
    length: int
    width: int
    num_layers: int
    mlp_dim: int
    vocab: int

    @classmethod
    def of(cls, config) -> Shape:
        m = config.model
        return cls(config.data.batch_size, m.seq_len, m.width, m.num_layers, m.mlp_dim, m.vocab_size)

    def params(self) -> int:
        d, m, v = self.width, self.mlp_dim, self.vocab
        block = 4 * (d * d + d) + (d * m + m) + (m * d + d) + 2 * d
        return v * d + self.length * d + self.num_layers * block + d * v + v


class Cost(NamedTuple):
    """Per member-step."""

    flops: float
    bytes: float


def member_cost(shape: Shape, fine: int, mixed: bool = False, kernel: bool = False) -> Cost:
    """One member's training step with attention at ``fine`` heads (``mixed``: the fused
    program's summed fine scores; ``kernel``: the attention core in the Pallas kernel,
    pallas_attention.kernel_cost, at static head counts only, so not with ``mixed``)."""
    b, t, d, layers, m, v = shape
    kernel = kernel and not mixed
    attention_matmuls = 0 if kernel else 2 * t * d  # scores and values: inside the kernel's count
    matmul = 3 * 2 * b * t * (layers * (4 * d * d + 2 * d * m + attention_matmuls) + d * v)  # forward + 2x backward
    scores, elements = layers * b * t * t, layers * b * fine * t * t
    counts = [
        (WIDTH, layers * b * t * d),
        (MLP, layers * b * t * m),
        (VOCAB, b * t * v),
        (PARAM, shape.params()),
    ]
    if kernel:
        counts.append((kernel_cost(b, t, d, fine), layers))
    else:
        counts += [(ATTENTION, elements), (SCORE_ROW, scores)]
    if mixed:
        counts.append(((MIXING[0] * fine, MIXING[1]), elements))
    return Cost(matmul + sum(c[0] * n for c, n in counts), sum(c[1] * n for c, n in counts))


def step_seconds(cost: Cost, device: Device) -> float:
    return max(cost.flops / device.peak_flops, cost.bytes / device.hbm_bytes_per_s)


def sweep_cost(shape: Shape, programs, device: Device, devices: int = 1, kernel: bool = False) -> dict:
    """Predicted figures of a sweep whose programs run one after another.

    ``programs``: per program, its groups as (members, fine heads, mixed). A program's
    member axis is sharded over ``devices`` when they divide it, else every device
    computes every member (placement.py), so that case costs ``devices`` times more.
    Returns per member-step FLOPs and bytes (averaged over members), member-steps/s of the
    whole sweep and the memory per device (states of every member, activations of the
    largest program; fp32). ``kernel``: static head counts run the Pallas kernel.
    """
    members = sum(n for groups in programs for n, _, _ in groups)
    flops = nbytes = seconds = 0.0
    states = activations = 0.0
    member_state = 16.0 * shape.params()  # params, gradients, Adam m and v
    for groups in programs:
        size = sum(n for n, _, _ in groups)
        share = 1.0 / devices if size % devices == 0 else 1.0
        program_activations = 0.0
        for n, fine, mixed in groups:
            cost = member_cost(shape, fine, mixed, kernel)
            flops, nbytes = flops + n * cost.flops, nbytes + n * cost.bytes
            seconds += n * share * step_seconds(cost, device)
            program_activations += n * share * activation_bytes(shape, fine, kernel and not mixed)
        states += size * share * member_state
        activations = max(activations, program_activations)
    return {
        "flops_per_member_step": flops / members,
        "bytes_per_member_step": nbytes / members,
        "member_steps_per_s": members / seconds,
        "memory_per_device_bytes": states + activations,
    }


def activation_bytes(shape: Shape, fine: int, kernel: bool = False) -> float:
    """Activations one member keeps for its backward pass: per layer the residual stream,
    norms, q/k/v and MLP rows and the (F, T, T) scores, probabilities and dropout mask
    (with the kernel: its output and (F, T) row statistics); plus the logits (fp32)."""
    b, t, d, layers, m, v = shape
    per_layer = b * t * (8 * d + 2 * m) + (b * t * d + b * fine * t if kernel else 3 * b * fine * t * t)
    return 4.0 * (layers * per_layer + 2 * b * t * v)
