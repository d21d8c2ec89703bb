"""The analytic cost model (models/cost.py) against XLA's own count of compiled steps, and
its roofline and sharding arithmetic."""

import jax
import pytest

from mhjax.experiments import make_experiment
from mhjax.models import cost
from mhjax.plan import pricing
from mhjax.train import engine
from mhjax.train.loop import stack_constants
from tests.conftest import tiny_sequence_config

# The model was fitted on the paper's shapes and the tiny config; on other shapes it is held
# to XLA's count within this (the fused program's mixing is the loosest term, ~10 %).
TOLERANCE = 0.15


def hlo_cost(experiment, strategy):
    """XLA's FLOPs and bytes of one training step per member (a one-step chunk: XLA counts a
    loop body once whatever its trip count), on the JAX attention path."""
    programs = experiment.programs(strategy, "gpu")
    flops = nbytes = 0.0
    for program in programs:
        consts = stack_constants(experiment, program.members)
        states = jax.eval_shape(engine.make_init(program.recipe), consts)
        analysis = engine.make_train_chunk(program.recipe, 1).lower(states, consts).compile().cost_analysis()
        flops, nbytes = flops + analysis["flops"], nbytes + analysis["bytes accessed"]
    return flops / len(experiment.members), nbytes / len(experiment.members)


# ~21 s: the hand-count tests check every term
@pytest.mark.slow
def test_cost_model_matches_xlas_count_on_unseen_shapes():
    config = tiny_sequence_config(heads=(1, 4))
    config.attention = "jax"  # the kernels hide their cost from XLA
    config.model.update(width=32, seq_len=16, mlp_dim=48)
    experiment = make_experiment(config)
    shape = cost.Shape.of(config)
    measured = {}
    for strategy in ("fused", "grouped", "one_program"):
        flops, nbytes = measured[strategy] = hlo_cost(experiment, strategy)
        predicted = cost.sweep_cost(
            shape, pricing.program_groups(experiment.programs(strategy, "gpu")), cost.DEVICES["h200"]
        )
        assert predicted["flops_per_member_step"] == pytest.approx(flops, rel=TOLERANCE), strategy
        assert predicted["bytes_per_member_step"] == pytest.approx(nbytes, rel=TOLERANCE), strategy
    assert measured["fused"][1] > measured["grouped"][1]  # the padded fine heads cost traffic
    # one program for every member, at grouped's cost: attention at each group's own head count
    for one, apart in zip(measured["one_program"], measured["grouped"]):
        assert one <= 1.25 * apart


def test_member_cost_counts_fine_heads_and_mixing():
    shape = cost.Shape(batch=50, length=100, width=64, num_layers=4, mlp_dim=128, vocab=256)
    one, sixteen = cost.member_cost(shape, 1), cost.member_cost(shape, 16)
    elements = 4 * 50 * 100 * 100
    assert sixteen.bytes - one.bytes == pytest.approx(15 * elements * cost.ATTENTION[1])
    mixed = cost.member_cost(shape, 16, mixed=True)
    assert mixed.flops - sixteen.flops == pytest.approx(16 * elements * 16 * cost.MIXING[0])
    # the count of parameters is flax's (tiny config: width 16, 1 layer, MLP 32, vocab 16, T 8)
    experiment = make_experiment(tiny_sequence_config(heads=(2,)))
    assert cost.Shape.of(experiment.config).params() == experiment.member_info(experiment.members[0])["params"]


def test_roofline_and_sharding_arithmetic():
    device = cost.Device("test", peak_flops=100.0, hbm_bytes_per_s=10.0, memory_bytes=1e9, source="")
    assert cost.step_seconds(cost.Cost(flops=200.0, bytes=10.0), device) == 2.0  # compute-bound
    assert cost.step_seconds(cost.Cost(flops=100.0, bytes=50.0), device) == 5.0  # memory-bound
    shape = cost.Shape(batch=4, length=8, width=16, num_layers=1, mlp_dim=32, vocab=16)
    seconds = cost.step_seconds(cost.member_cost(shape, 2), device)
    # 4 members sharded over 2 devices: 2 member-steps per device per step
    sharded = cost.sweep_cost(shape, [[(4, 2, False)]], device, devices=2)
    assert sharded["member_steps_per_s"] == pytest.approx(4 / (2 * seconds))
    # 3 members do not divide over 2 devices: replicated, each device computes all 3
    replicated = cost.sweep_cost(shape, [[(3, 2, False)]], device, devices=2)
    assert replicated["member_steps_per_s"] == pytest.approx(3 / (3 * seconds))
    # one program of two groups costs what the two programs do, one after another
    together = cost.sweep_cost(shape, [[(2, 1, False), (2, 2, False)]], device)
    apart = cost.sweep_cost(shape, [[(2, 1, False)], [(2, 2, False)]], device)
    assert together["member_steps_per_s"] == pytest.approx(apart["member_steps_per_s"])
    assert together["flops_per_member_step"] == pytest.approx(apart["flops_per_member_step"])


@pytest.mark.slow  # ~26 s: the model itself is tested against XLA below and above
def test_cost_model_script_reports_every_strategy_and_variant(tmp_path):
    """benchmarks/studies/cost_model.py end to end on the tiny config: the JSON keys scripts read, the
    one_program / grouped ratio, and a variant's accuracy check on the layout model."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import config_source

    config = tmp_path / "tiny.py"
    config.write_text(config_source(tiny_sequence_config(heads=(1, 2))))
    out = tmp_path / "cost.json"
    specs = "grouped,one_program,one_program:bf16,one_program:pallas"  # fused: the XLA-count test above
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "studies", "cost_model.py")
    command = [sys.executable, script, "--config", str(config), "--strategies", specs]
    subprocess.run([*command, "--json", str(out)], check=True, capture_output=True, timeout=600)
    payload = json.loads(out.read_text())
    strategies = payload["strategies"]
    assert list(strategies) == specs.split(",")
    keys = ("gflop_per_member_step", "gb_per_member_step", "analytic_gflop_per_member_step")
    for spec, row in strategies.items():
        assert all(row[k] > 0 for k in (*keys, "roofline_member_steps_per_s", "compile_s")), spec
    ratio = payload["one_program_over_grouped"]
    one, grouped = strategies["one_program"], strategies["grouped"]
    assert ratio["bytes"] == pytest.approx(one["gb_per_member_step"] / grouped["gb_per_member_step"])
    assert ratio["flops"] <= 1.25 and ratio["bytes"] <= 1.25
    # bf16 scores move the step a little, but not nothing and not wildly
    assert 0 < strategies["one_program:bf16"]["accuracy"]["grad_rel_l2"] < 0.05
    # the Pallas kernel: its analytic traffic plus XLA's count of the rest (the kernel an opaque
    # stand-in), below the JAX path's, and the cost model agrees with that count
    kernel = strategies["one_program:pallas"]
    assert 0 < kernel["kernel_gb_per_member_step"] < kernel["gb_per_member_step"] < one["gb_per_member_step"]
    assert kernel["cost_model_gb_per_member_step"] == pytest.approx(kernel["gb_per_member_step"], rel=TOLERANCE)
    assert kernel["cost_model_gflop_per_member_step"] == pytest.approx(kernel["gflop_per_member_step"], rel=TOLERANCE)
    assert sum(kernel["gb_by_part_per_member_step"].values()) > 0


def test_dots_run_at_the_dot_rate_and_bytes_at_the_calibrated_bandwidth():
    device = cost.Device("test", 100.0, 10.0, 1e9, "", dot_flops=1000.0, effective_bytes_per_s=5.0)
    # 200 dot FLOPs at 1000/s + 100 other FLOPs at 100/s = 1.2 s; 5 bytes at 5 B/s = 1 s
    assert cost.times(cost.Cost(flops=300.0, bytes=5.0, dot_flops=200.0), device) == pytest.approx((1.2, 1.0))
    # the calibration reproduces its own figures: XLA:CPU's counts -> the compiled GPU program's
    h200 = cost.DEVICES["h200"]
    jax_path = cost.Cost(flops=0.0, bytes=2.453e9, core_bytes=2.453e9 - 0.913e9)
    pallas = cost.Cost(flops=0.0, bytes=0.336e9, kernel_bytes=0.141e9)
    assert cost.device_bytes(jax_path, h200) == pytest.approx(1.483e9)
    assert cost.device_bytes(pallas, h200) == pytest.approx(0.316e9)
    assert 1.0 / cost.step_seconds(jax_path, h200) == pytest.approx(2104.0)  # the measured rate
    assert h200.bandwidth() / h200.hbm_bytes_per_s == pytest.approx(0.65, abs=0.01)


def test_the_kernels_padded_dots_are_memory_bound_at_tf32_not_at_fp32():
    """The paper shapes' 16-head member under the Pallas kernel: 11.3 of its 19.2 GFLOP are the
    kernel's padded dots. Priced at fp32 (the old model) it sat at the compute roof; at TF32
    every head count is bound by memory, and sweep_cost says so per head count."""
    shape = cost.Shape(batch=50, length=100, width=64, num_layers=4, mlp_dim=128, vocab=256)
    h200 = cost.DEVICES["h200"]
    sixteen = cost.member_cost(shape, 16, kernel=True)
    k = cost.kernel_cost(50, 100, 64, 16)
    # T 100: two 64-row tiles, 3 causal tile pairs, forward (2 dots) and backward (7); head dim 4 -> 16
    assert k.dot_flops == 50 * 16 * 9 * 2 * 3 * 64 * 64 * 16
    # XLA's matmuls are the output projection and the readout; the kernels' dots (attention, the
    # q/k/v projection and the MLP, padded, the MLP's hidden layer recomputed) replace the rest
    rows = 50 * 100
    xla = 3 * 2 * rows * (4 * 64 * 64 + 64 * 256)
    assert sixteen.dot_flops == pytest.approx(xla + 4 * cost.kernels_cost(shape, 16).dot_flops)
    assert cost.kernels_cost(shape, 16).dot_flops > k.dot_flops + 3 * 2 * rows * (3 * 64 * 64 + 2 * 64 * 128)
    fp32 = h200._replace(dot_flops=None)
    compute, memory = cost.times(sixteen, fp32)
    assert compute > memory
    compute, memory = cost.times(sixteen, h200)
    assert compute < memory
    groups = [[(2, 1, False), (2, 4, False), (2, 8, False), (2, 16, False)]]
    bound = cost.sweep_cost(shape, groups, h200, kernel=True)["bound_by_heads"]
    assert {h: b["bound"] for h, b in bound.items()} == {1: "memory", 4: "memory", 8: "memory", 16: "memory"}
    assert cost.sweep_cost(shape, groups, fp32, kernel=True)["bound_by_heads"][16]["bound"] == "compute"


def test_scanned_layers_under_the_kernels_add_their_measured_stack_copies():
    """The paper sweep compiled for an H200 moves 0.497 GB per member-step with scanned layers
    against 0.316 unrolled (benchmarks/studies/gpu_bytes.py); the model adds that difference, and only
    where the kernels run (the JAX path is not scanned on a GPU)."""
    shape = cost.Shape(batch=50, length=100, width=64, num_layers=4, mlp_dim=128, vocab=256)
    h200, groups = cost.DEVICES["h200"], [[(2, 1, False), (2, 4, False), (2, 8, False), (2, 16, False)]]
    unrolled, scanned = (cost.sweep_cost(shape, groups, h200, kernel=True, scanned=s) for s in (False, True))
    extra = scanned["compiled_bytes_per_member_step"] - unrolled["compiled_bytes_per_member_step"]
    assert extra == pytest.approx(0.497e9 - 0.316e9)
    assert scanned["bytes_per_member_step"] == unrolled["bytes_per_member_step"]  # XLA:CPU's count: unchanged
    assert scanned["member_steps_per_s"] < unrolled["member_steps_per_s"]
    jax_path = [cost.sweep_cost(shape, groups, h200, scanned=s)["member_steps_per_s"] for s in (False, True)]
    assert jax_path[0] == jax_path[1]


def test_the_estimate_and_the_member_table_say_which_flops_they_count(tmp_path):
    # docs/text.md's CPU overrides of configs/text.py: the MLP kernel fits in bfloat16 only, so the
    # FLOPs as priced move with the dtype while the analytic matmuls do not (docs/bfloat16.md)
    import mhjax
    from mhjax.models import flops
    from mhjax.plan import lines

    corpus = tmp_path / "c.txt"
    corpus.write_bytes(bytes(range(256)) * 8)
    sizes = {"model.width": 64, "model.num_layers": 2, "model.mlp_dim": 256, "model.seq_len": 64}
    overrides = {"data.path": str(corpus), "model.dtype": "bfloat16", "sweep.heads": (1, 4, 16), **sizes}
    experiment = make_experiment(mhjax.load_config("text", overrides))
    priced = []
    for dtype in ("float32", "bfloat16"):  # the dry run's estimate line is prediction_text's
        p = experiment.plan("gpu", 1).predict(dtype=dtype)
        line = cost.prediction_text(p, 1000)
        every, dots = p["flops_per_member_step"] / 1e9, p["dot_flops_per_member_step"] / 1e9
        assert f"{every:.2f} GFLOP per member-step as priced (every FLOP the program runs" in line, line
        assert f"{dots:.2f} of them in matmuls" in line, line
        priced.append(every)
    analytic = flops.train_step_flops(32, 64, 64, 2, 256, 256) / 1e9
    table = lines.member_lines(experiment.plan("gpu", 1))
    assert "matmul GFLOP/step" in table[0] and table[-1] == lines.MATMUL_NOTE
    assert all(row.split()[2] == f"{analytic:.3f}" == "1.510" for row in table[1:4]), table
    assert priced[1] > priced[0] > analytic  # the MLP kernel's recomputation, bfloat16 only


def test_on_a_tpu_the_kernel_is_priced_by_its_stated_work_and_calibrated_to_the_compilers_count():
    """Under mhjax's TPU kernel a member's layer moves the kernel's HBM bytes, counted here by
    hand at T = 100 (one tile): forward reads the query tile's and the key tile's (T, 3D) rows and
    writes (T, D) and the (T, heads) float32 log-sum-exp; backward reads q/k/v twice, dout, out
    and the statistics and writes (T, 3D). The v5e device's ratios are what make the paper sweep
    cost what the TPU compiler's program moves (models/cost_tpu.py: 0.3375 GB per member-step
    besides the kernel, 1.264 on the JAX path), and the kernel path saves no maps, only its
    row statistics."""
    from mhjax.models import cost_tpu

    shape = cost.Shape(batch=50, length=100, width=64, num_layers=4, mlp_dim=128, vocab=256)
    rows, d = 50 * 100, 64

    def by_hand(heads):  # 4 layers, float32
        return 4 * 4 * (rows * (3 * d + 3 * d + d) + rows * heads + rows * (5 * d + 3 * d + 3 * d) + rows * heads)

    for heads in (1, 16):
        assert cost.member_cost(shape, heads, kernel="tpu").kernel_bytes == by_hand(heads)
        assert cost.member_cost(shape, heads, mixed=True, kernel="tpu").kernel_bytes == 0  # fused: the JAX path
    v5e, groups = cost.DEVICES["tpu-v5e"], [[(2, 1, False), (2, 4, False), (2, 8, False), (2, 16, False)]]
    assert v5e.compiled_bytes == cost_tpu.COMPILED_BYTES
    kernel = cost.sweep_cost(shape, groups, v5e, kernel="tpu", scanned=True)
    stated = sum(by_hand(h) for h in (1, 4, 8, 16)) / 4
    assert kernel["compiled_bytes_per_member_step"] == pytest.approx(0.3375e9 + stated, rel=2e-3)
    assert cost.sweep_cost(shape, groups, v5e)["compiled_bytes_per_member_step"] == pytest.approx(1.264e9, rel=2e-3)
    jax_acts = cost.activation_bytes(shape, 16)
    lse = 4 * 4 * 50 * 100 * 128  # 4 layers of (B, T, 16) float32, padded to 128 lanes
    assert cost.activation_bytes(shape, 16, "tpu") == jax_acts - 4 * 4 * 3 * 50 * 16 * 100 * 100 + lse


def test_the_tpu_kernels_time_is_priced_by_unit_with_heads_padded_to_the_lanes():
    """models/cost_tpu.py at T = 100 (one tile), 4 heads of 16, B = 50, counted by hand: 7 dots
    per head (2 forward, 5 backward), each 2 x 100 x 128 x 128 on the MXU (the 100 keys and 64
    lanes padded to 128) at a third of the bf16 rate in float32; the vector work on (104, 128)
    padded tiles; one grid step per batch row and call. T = 1,021 costs what 1,024 does (padded),
    whose 4 tiles run 10 pairs; and the step's bound is its largest term."""
    from mhjax.models import cost_tpu

    t = cost_tpu.kernel_time(50, 100, 64, 4, "float32")
    assert t.mxu == pytest.approx(50 * 4 * 7 * 2 * 100 * 128 * 128 / (197e12 / 3))
    ops = sum(cost_tpu.VECTOR_OPS.values()) + cost_tpu.VECTOR_OPS["dropout"]
    assert t.vector == pytest.approx(50 * 4 * 104 * 128 * ops / cost_tpu.VECTOR_RATE)
    assert t.grid == pytest.approx(2 * 50 * 0.35e-6)
    assert cost_tpu.kernel_time(50, 100, 64, 4, "bfloat16").mxu == pytest.approx(t.mxu / 3)
    assert cost_tpu.kernel_time(50, 100, 16, 1, "float32").mxu == pytest.approx(t.mxu / 4)  # 16 lanes pad to 128
    assert cost_tpu.kernel_time(50, 1021, 64, 4) == cost_tpu.kernel_time(50, 1024, 64, 4)
    long = cost_tpu.kernel_time(50, 1024, 64, 4)
    assert long.mxu == pytest.approx(50 * 10 * 4 * 7 * 2 * 256 * 256 * 128 / (197e12 / 3))
    assert long.grid == pytest.approx(2 * 50 * 16 * 0.35e-6)  # every (query, key) tile step, skipped ones too
    v5e, groups = cost.DEVICES["tpu-v5e"], [[(2, 1, False), (2, 16, False)]]
    for length in (100, 1024):
        for dtype in ("float32", "bfloat16"):
            shape = cost.Shape(batch=50, length=length, width=64, num_layers=4, mlp_dim=128, vocab=256)
            for row in cost.sweep_cost(shape, groups, v5e, kernel="tpu", dtype=dtype)["bound_by_heads"].values():
                parts = {"matmuls": row["matmul_s"], "vector work": row["vector_s"], "grid steps": row["grid_s"]}
                compute = sum(parts.values())
                assert compute == pytest.approx(row["compute_s"])
                largest = "memory" if row["memory_s"] >= compute else max(parts, key=parts.get)
                assert row["bound"] == largest


def test_a_sweep_the_tpu_byte_ratios_were_fitted_on_prints_no_error():
    """The ratios were fitted on the paper sweep at T = 100 in float32: its dry run shows the
    model's figure without an "error"; T = 1,024 and bfloat16 were not fitted: theirs is shown."""
    from mhjax.models import cost_tpu
    from mhjax.train import deviceless

    paper = cost.Shape(batch=50, length=100, width=64, num_layers=4, mlp_dim=128, vocab=256)
    assert cost_tpu.fitted(paper, "float32")
    assert not cost_tpu.fitted(paper._replace(length=1024), "float32") and not cost_tpu.fitted(paper, "bfloat16")
    chunk = deviceless.Executable(("chunk", "all", 200), 1.0, 0, 0, 0, 0, {}, 0, 0.3e9, 0.1e9)
    fitted = deviceless._bytes_line(chunk, "chunk all 200", True, 0.42e9, fitted=True)
    assert "fitted on this sweep" in fitted and "error" not in fitted
    other = deviceless._bytes_line(chunk, "chunk all 200", True, 0.42e9)
    assert other.endswith("models/cost.py: 0.420 GB, error +5.0%")
