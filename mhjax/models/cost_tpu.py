"""The cost model's calibration to the TPU compiler (models/cost.py's "tpu-v5e" Device): what
its compiled program moves per XLA:CPU byte of the model's terms, as issue 29 did for the H200.

Measured (issue 49) by a deviceless compile for a v5e-8 slice (jax[tpu] 0.10.2, libtpu
0.0.42.1) of the paper sweep, 8 seeds (64 members, 8 per chip), one_program, scanned layers,
one device's training chunk; bytes per member-step as train/hlo.py counts the TPU's program
(each top-level op's HBM operands and results once per trip: values the compiler keeps in
VMEM move none, an async copy is charged once, a scan's in-place updates their slices, a
Pallas call its own stated bytes), 2026-12-06:
  attention=auto (mhjax's TPU kernel): 0.259 GB besides the kernel calls' 0.087 GB;
  attention=jax:                        1.456 GB.
The model's XLA:CPU count of the same steps (models/cost.py's terms at the paper's shape, per
member averaged over the sweep's 1, 4, 8 and 16 heads): 0.711 GB besides the kernel under the
TPU kernel (WIDTH, ATTENTION_KERNEL_WIDTH, MLP, VOCAB, PARAM), the kernel's 0.087 GB (its
stated bytes: the same), and on the JAX path 0.913 GB besides the attention core's 1.341 GB.
The TPU's memory-space assignment keeps much of the step in VMEM, so its program moves about
a third of what XLA:CPU counts around the kernel.
"""

REST = 0.259 / 0.711  # 0.36: the step around the attention core
JAX_CORE = (1.456 - REST * 0.913) / 1.341  # 0.84: the JAX attention core (maps, softmax, dropout)
COMPILED_BYTES = (REST, JAX_CORE)
