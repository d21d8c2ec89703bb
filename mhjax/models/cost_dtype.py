"""bfloat16 in the cost model (``config.model.dtype``; docs/bfloat16.md): which of models/cost.py's
bytes are at the compute dtype, and which dot rate the step runs at.

docs/bfloat16.md's table: parameters, Adam's moments, gradients of the parameters, the RMSNorm
statistics, the attention scores, softmax and probabilities, and the logits are float32; the
embeddings, q/k/v, the attention output, the MLP and read-out activations and the residual
stream are in the compute dtype. So of cost.py's terms (XLA's count of the float32 step, by
what they are counted per):
- per row and unit of width or MLP (WIDTH, MLP, KERNEL_WIDTH, ATTENTION_KERNEL_WIDTH,
  SCAN_KERNEL_WIDTH: the activations and the residual stream) move at the compute dtype's
  element size, 2 bytes in bfloat16 (``activation_factor``: 0.5);
- per score element (ATTENTION, SCORE_ROW, MIXING: scores, softmax, probabilities, masks), per
  logit (VOCAB) and per parameter (PARAM, KERNEL_PARAM) stay at 4.
The compiled GPU program's fusion ratios (cost.GPU_REST, cost.GPU_JAX_CORE: measured in float32)
are applied to the bfloat16 bytes as they are. FLOPs are the float32 step's.

The Pallas kernels read and write bfloat16 with float32 accumulation (docs/bfloat16.md): their
cost functions' ``itemsize`` prices x, the outputs, their gradients and the weights at the compute
dtype, the row statistics, norm scales and weight-gradient partials at 4 bytes
(pallas_attention.kernel_cost, pallas_block.norm_dense_cost, mlp_block_cost), and the block
kernels run where their weights fit in that dtype (pallas_block.block_parts: bfloat16 fits twice
the elements).

Dots: the device's bfloat16 dense tensor-core rate where it has one (Device.bf16_dot_flops:
the H200's 989 TFLOP/s, twice its TF32 rate); the elementwise rest at the fp32 rate (the
softmax, norms and Adam run in float32).
"""

from __future__ import annotations

DTYPES = ("float32", "bfloat16")  # models/precision.DTYPES
ELEMENT_BYTES = {"float32": 4, "bfloat16": 2}


def element_bytes(dtype: str) -> int:
    if dtype not in ELEMENT_BYTES:
        raise ValueError(f"cost model dtype: one of {', '.join(DTYPES)}; got {dtype!r}")
    return ELEMENT_BYTES[dtype]


def activation_factor(dtype: str) -> float:
    """The share of a float32 activation term's bytes left in ``dtype``: 1 or 0.5."""
    return element_bytes(dtype) / 4.0
