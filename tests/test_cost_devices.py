"""The cost model over N devices (models/cost_devices.py) and in bfloat16 (models/cost_dtype.py),
against hand counts; the dry run's N-device and bfloat16 lines."""

import re

import pytest

from mhjax import cli
from mhjax.experiments import make_experiment
from mhjax.models import cost
from mhjax.train import deviceless
from mhjax.train import target as targets
from tests.conftest import config_source, set_field, tiny_sequence_config

DEVICE = cost.Device("test", peak_flops=100.0, hbm_bytes_per_s=10.0, memory_bytes=1e9, source="")
SHAPE = cost.Shape(batch=4, length=8, width=16, num_layers=1, mlp_dim=32, vocab=16)


def member(heads):
    c = cost.member_cost(SHAPE, heads)
    return c, cost.step_seconds(c, DEVICE)


def test_an_even_split_is_the_one_device_cost_halved():
    """heads 1, 4, 1, 4 over 2 devices: each device's slice is one 1-head and one 4-head member."""
    (c1, s1), (c4, s4) = member(1), member(4)
    layout = [[(1, 1, False), (1, 4, False), (1, 1, False), (1, 4, False)]]
    one, two = (cost.sweep_cost(SHAPE, layout, DEVICE, devices=n) for n in (1, 2))
    assert one["member_steps_per_s"] == pytest.approx(4 / (2 * s1 + 2 * s4))
    assert two["member_steps_per_s"] == pytest.approx(4 / (s1 + s4)) == pytest.approx(2 * one["member_steps_per_s"])
    d = two["per_device"]
    assert d["devices"] == 2 and d["member_steps_per_step"] == 2 and d["replicated_programs"] == []
    assert (
        d["flops_per_step"]
        == pytest.approx(c1.flops + c4.flops)
        == pytest.approx(one["per_device"]["flops_per_step"] / 2)
    )
    assert d["compiled_bytes_per_step"] == pytest.approx(c1.bytes + c4.bytes)  # the test device: no fusion ratio
    assert d["collective_bytes_per_step"] == 0.0
    # at each checkpoint a device copies its two members' parameters and Adam moments (float32) to the host
    assert d["host_bytes_per_checkpoint"] == 2 * 3 * 4 * SHAPE.params()
    # per member-step figures do not depend on the devices
    assert two["bytes_per_member_step"] == one["bytes_per_member_step"]


def test_groups_that_split_unevenly_step_at_the_busiest_devices_pace():
    """heads 1, 1, 4, 4 in that order: device 0 gets both 1-head members, device 1 both 4-head ones."""
    (_, s1), (c4, s4) = member(1), member(4)
    assert s4 > s1
    two = cost.sweep_cost(SHAPE, [[(2, 1, False), (2, 4, False)]], DEVICE, devices=2)
    assert two["member_steps_per_s"] == pytest.approx(4 / (2 * s4))
    assert two["per_device"]["flops_per_step"] == pytest.approx(2 * c4.flops)


def test_a_program_whose_members_do_not_divide_the_devices_is_computed_whole_on_each():
    """A 3-member program (replicated) and a 2-member one (split) over 2 devices: each device
    computes 3 + 1 member-steps per sweep step."""
    c, s = member(2)
    programs = [[(3, 2, False)], [(2, 2, False)]]
    two = cost.sweep_cost(SHAPE, programs, DEVICE, devices=2)
    d = two["per_device"]
    assert d["replicated_programs"] == [0] and d["member_steps_per_step"] == 4
    assert d["flops_per_step"] == pytest.approx(4 * c.flops)
    assert two["member_steps_per_s"] == pytest.approx(5 / (4 * s))
    assert two["memory_per_device_bytes"] == pytest.approx(
        4 * 16 * SHAPE.params() + 3 * cost.activation_bytes(SHAPE, 2)
    )


def test_bfloat16_halves_the_activation_terms_and_keeps_the_rest_float32():
    """The JAX path: WIDTH and MLP (per row and unit of width / MLP) at half, the attention core,
    logits and parameters as in float32; the same FLOPs."""
    b, t, d, layers, m, v = SHAPE[:6]
    f32, bf16 = (cost.member_cost(SHAPE, 4, dtype=dt) for dt in ("float32", "bfloat16"))
    halved = 0.5 * layers * b * t * (d * cost.WIDTH[1] + m * cost.MLP[1])
    assert bf16.bytes == pytest.approx(f32.bytes - halved)
    assert bf16.core_bytes == f32.core_bytes and bf16.flops == f32.flops and bf16.dtype == "bfloat16"
    # activations kept for the backward: rows at 2 bytes, the (4, T, T) maps and the logits at 4
    rows, maps = b * t * (5 * d + 3 * d + 2 * m), 3 * b * 4 * t * t
    assert cost.activation_bytes(SHAPE, 4, dtype="bfloat16") == layers * (2 * rows + 4 * maps) + 4 * 2 * b * t * v
    assert cost.activation_bytes(SHAPE, 4) == layers * 4 * (rows + maps) + 4 * 2 * b * t * v


def test_bfloat16_kernels_read_their_rows_at_two_bytes_and_their_statistics_at_four():
    """Width 512 (the block kernels do not fit): the attention kernel reads q, k, v forward and
    writes out, reads q, k, v, out, dout backward and writes dq, dk, dv, twelve (B, T, A) arrays at
    2 bytes, and writes then reads its (B, H, T) row statistics at 4; XLA's activation terms
    around it (WIDTH, ATTENTION_KERNEL_WIDTH, MLP) at half, logits and parameters as in float32."""
    shape = cost.Shape(batch=4, length=8, width=512, num_layers=2, mlp_dim=64, vocab=16)
    b, t, d, layers, m, v = shape[:6]
    heads = 8
    bf16 = cost.member_cost(shape, heads, kernel=True, dtype="bfloat16")
    assert bf16.kernel_bytes == layers * (2 * 12 * b * t * d + 4 * 2 * b * heads * t)
    rows = layers * b * t
    halved = 0.5 * rows * (d * (cost.WIDTH[1] + cost.ATTENTION_KERNEL_WIDTH[1]) + m * cost.MLP[1])
    assert bf16.bytes == pytest.approx(
        halved + b * t * v * cost.VOCAB[1] + shape.params() * cost.PARAM[1] + bf16.kernel_bytes
    )


def test_bfloat16_block_kernels_run_where_their_weights_fit_in_bfloat16():
    """Width 64, MLP 256: mlp_block's weights (64 x 256) fit one program in bfloat16, not in
    float32 (pallas_block.fits), so only bfloat16 prices the block kernels, at itemsize 2."""
    from mhjax.models import pallas_block
    from mhjax.models.pallas_attention import kernel_cost

    shape = cost.Shape(batch=4, length=8, width=64, num_layers=1, mlp_dim=256, vocab=16)
    f32, bf16 = (cost.member_cost(shape, 2, kernel=True, dtype=dt) for dt in ("float32", "bfloat16"))
    assert f32.kernel_bytes == kernel_cost(4, 8, 64, 2).bytes  # the attention kernel alone
    parts = [kernel_cost(4, 8, 64, 2, 2), pallas_block.norm_dense_cost(32, 64, 192, 2)]
    parts.append(pallas_block.mlp_block_cost(32, 64, 256, 2))
    assert bf16.kernel_bytes == pytest.approx(sum(p.bytes for p in parts))


def test_the_h200_runs_bfloat16_dots_at_twice_its_tf32_rate():
    h200 = cost.DEVICES["h200"]
    assert (h200.dot_rate(), h200.dot_rate("bfloat16")) == (494.7e12, 989.5e12)
    dots = cost.Cost(flops=1e12, bytes=0.0, dot_flops=1e12)
    assert cost.times(dots, h200)[0] == pytest.approx(1e12 / 494.7e12)
    assert cost.times(dots._replace(dtype="bfloat16"), h200)[0] == pytest.approx(1e12 / 989.5e12)
    assert cost.DEVICES["tpu-v5e"].dot_rate("bfloat16") == cost.DEVICES["tpu-v5e"].dot_rate()  # bf16 passes already


SPLIT = r"~([\d,]+) member-steps/s for the whole sweep, against ~([\d,]+) on one"


def _numbers(line):
    return [float(x.replace(",", "")) for x in re.findall(r"~([\d,]+) member-steps/s", line)]


def test_the_dry_run_for_two_h200s_predicts_the_split_sweep_beside_one_device(tmp_path, capsys, monkeypatch):
    """--target h200x2, the compiles left out (tests/test_target_devices.py compiles for real):
    the plan printed before them has the rate over 2 devices beside one device's, and the
    sweep in bfloat16."""
    config = set_field(tiny_sequence_config(heads=(1, 4), seed=(0, 1)), "strategy", "one_program")
    path = tmp_path / "tiny.py"
    path.write_text(config_source(config))
    executable = deviceless.Executable(
        ("chunk", "all", 3), 1.0, 1, 1, 1, 0, {}, 0, bytes_per_member_step=None, kernel_bytes_per_member_step=None
    )
    monkeypatch.setattr(targets, "devices", lambda target, count=None: [])
    report = lambda experiment, target, log=print, only=(): deviceless.Report(target, "", [executable], None, 8)
    monkeypatch.setattr(deviceless, "compile_for", report)
    assert cli.main(["train", "--config", str(path), "--dry-run", "--target", "h200x2"]) == 0
    text = capsys.readouterr().out
    split = next(line for line in text.splitlines() if line.startswith("  over 2 x NVIDIA H200 SXM: "))
    many, one = (float(x.replace(",", "")) for x in re.search(SPLIT, split).groups())
    experiment = make_experiment(config)
    plan = experiment.plan("gpu", 2, planned=True)
    assert many == round(plan.predict("one_program", 2)["member_steps_per_s"])
    assert one == round(plan.predict("one_program", 1)["member_steps_per_s"])
    assert f"({many / one:.2f}x)" in split and "per device and sweep step (the busiest): 2 member-steps" in split
    assert "between devices: none" in text
    (bf16,) = [line for line in text.splitlines() if line.startswith("  in bfloat16: ")]
    assert _numbers(bf16)[0] == round(plan.predict("one_program", 2, "bfloat16")["member_steps_per_s"])
