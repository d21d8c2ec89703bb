"""The paper model at long and awkward T compiled for a v5e-8 (deviceless, libtpu): every
chunk compiles and fits the chip's 16 GiB, runs mhjax's TPU kernel (forward and backward, each
head count's group) and holds no (T, T) value; T = 1,021 is padded to 1,024 rows (four 256-row
tiles), so no divisor hunt and no whole-sequence tile.

Slow (one chunk compile each, ~1 minute on 2 cores), and skipped without the TPU compiler:
python3 -m venv /tmp/tpuvenv && /tmp/tpuvenv/bin/pip install -e . "jax[tpu]==0.10.2" pytest
then JAX_PLATFORMS=cpu /tmp/tpuvenv/bin/python -m pytest -m slow -n 0 tests/test_tpu_long_sequences.py
(libtpu lets one process at a time hold it). benchmarks/RESULTS.md ("TPU at any T") has the
compile times of one run of this matrix."""

import pytest

import mhjax
from mhjax.experiments import make_experiment
from mhjax.train import deviceless
from mhjax.train import target as targets

MATRIX = [(length, dtype) for length in (1021, 1024, 2048, 4096, 8192) for dtype in ("float32", "bfloat16")]


def dry_run(length: int, dtype: str, heads=(1, 16), seeds=(0, 1, 2, 3)):
    """The paper chunk at ``length`` and ``dtype`` with ``heads`` (one_program: each head count
    its own group of kernel calls; 2 members a chip), compiled for a v5e-8. At T = 8,192 in
    float32 the paper's batch of 50 rows needs 16.9 GiB a chip (the saved rows, the logits and
    XLA's temporaries, not the kernel): half of it."""
    batch = 25 if (length, dtype) == (8192, "float32") else 50
    overrides = {"model.seq_len": length, "model.dtype": dtype, "sweep.heads": heads, "sweep.seed": seeds}
    overrides["data.batch_size"] = batch
    config = mhjax.load_config("paper", {**overrides, "strategy": "one_program"})
    experiment = make_experiment(config)
    report = deviceless.compile_for(experiment, targets.load("v5e-8"), log=lambda m: None, only=("chunk",))
    return experiment, report


@pytest.mark.slow
@pytest.mark.skipif(not targets.tpu_compiler_available(), reason=f"no TPU compiler here; {targets.install_hint('tpu')}")
@pytest.mark.parametrize("length,dtype", MATRIX)
def test_the_paper_chunk_compiles_and_fits_a_v5e_at_long_t_with_the_kernel_and_no_t_by_t_value(length, dtype):
    experiment, report = dry_run(length, dtype)
    assert experiment.plan("tpu").attention.implementation == "pallas_tpu"
    (chunk,) = report.executables
    assert chunk.kernels == {"mhjax_tpu_attention_fwd": 2, "mhjax_tpu_attention_bwd": 2}  # heads 1 and 16
    assert chunk.square == 0
    assert chunk.total <= report.target.memory_bytes
    print(f"T = {length} {dtype}: compiled in {chunk.seconds:.1f} s, {chunk.total / 2**30:.2f} GiB per chip")
