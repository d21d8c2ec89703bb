"""`--target NAMExN`: a sweep planned and compiled for N compile-only GPUs on one host (issue 39
item 2: train/target.py, train/deviceless.py, train/hlo.py). The compile test needs the GPU
compiler (jax[cuda13]), as tests/test_target.py's."""

import pytest

from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.train import deviceless, hlo
from mhjax.train import target as targets
from tests.conftest import set_field, tiny_sequence_config
from tests.test_target import HLO, NEEDS_COMPILER


def test_name_x_n_is_n_devices_of_a_bundled_target():
    eight = targets.load("h200x8")
    assert eight.count == 8 and eight.device == "NVIDIA H200" and eight.text == targets.load("h200").text
    assert targets.load("h200").count == 1 and targets.load("a100x2").count == 2
    with pytest.raises(ConfigError, match=r"^--target: 'h200x0' needs N >= 1 devices \(e.g. h200x8\)$"):
        targets.load("h200x0")
    with pytest.raises(ConfigError, match=r"--target: must be one of a100, h100, h200 \(NAMExN"):
        targets.load("h300x8")


def test_hlo_reading_counts_collectives_and_the_members_of_kernel_calls():
    text = HLO + (
        "  %ags = (f32[2]{0}, f32[8]{0}) all-gather-start(%a), dimensions={0}\n"
        "  %agd = f32[8]{0} all-gather-done(%ags)\n"
        "  %ar.1 = f32[8]{0} all-reduce(%x), to_apply=%add\n"
        "  %y = f32[8]{0} fusion(%all-reduce.2), kind=kLoop, calls=%f\n"
    )
    assert hlo.collectives(text) == {"all-gather": 1, "all-reduce": 1}  # an async pair once; operands not
    assert hlo.collectives(HLO) == {}
    assert hlo.kernel_members(HLO) == [4]  # the Triton call's first result: f32[4,8]


def _executable(key, collectives=None, replicated=False):
    sizes = dict(seconds=1.0, arguments=2**20, outputs=2**20, temp=2**20, alias=0, kernels={}, square=0)
    e = deviceless.Executable(key, **sizes, bytes_per_member_step=None, kernel_bytes_per_member_step=None)
    return e._replace(collectives=collectives or {}, replicated=replicated, kernel_members=(8,))


def test_the_dry_run_names_replicated_programs_and_warns_of_collectives_in_a_training_chunk():
    target = targets.load("h200x8")
    executables = [
        _executable(("chunk", "all", 200)),
        _executable(("chunk", "h1", 200), {"all-gather": 3, "all-reduce": 1}, replicated=True),
        _executable(("evaluate", "h1"), {"all-gather": 2}, replicated=True),
    ]
    text = "\n".join(deviceless.lines(deviceless.Report(target, "2 programs", executables, None, None)))
    assert "target: 8 x NVIDIA H200 (h200x8)" in text
    chunk = next(line for line in text.splitlines() if line.strip().startswith("chunk all 200"))
    assert "split /8" in chunk and " none " in chunk and "no Triton kernel of 8 members" in chunk
    assert "replicated: program(s) h1: members do not divide the 8 devices" in text
    warnings = [line for line in text.splitlines() if line.startswith("warning:")]
    assert warnings == [
        "warning: training chunk h1 200 holds collectives (all-gather x3, all-reduce x1): members are "
        "independent, so a split chunk should need none (each step waits on them)"
    ]  # the evaluation's collectives are listed in its row, not warned of


@NEEDS_COMPILER
@pytest.mark.slow  # three compiles through Triton: ~1.5 minutes on 2 cores
def test_a_sweep_compiled_for_two_h200s_splits_its_kernels_and_has_no_collective():
    """h200x2: the training chunk's Pallas calls compute 2 of the 4 members each, nothing is
    gathered, also where one_program's groups do not split evenly; with 3 members (not dividing
    2 devices) the program is replicated and says so."""
    from mhjax.experiments import make_experiment

    config = set_field(
        set_field(tiny_sequence_config(heads=(1, 4), seed=(0, 1)), "model.seq_len", 12), "attention", "pallas"
    )
    set_field(config, "strategy", "auto")
    report = deviceless.compile_for(
        make_experiment(config), targets.load("h200x2"), log=lambda m: None, only=("chunk",)
    )
    (chunk,) = report.executables
    assert chunk.kernel_members == (2,) and chunk.collectives == {} and not chunk.replicated
    assert chunk.kernels["mhjax_attention_fwd"] == 2  # one call per head-count group, on each device
    # groups of 3 over 2 devices: each device runs its own group (a switch on the device index)
    set_field(config, "sweep.seed", (0, 1, 2))
    set_field(config, "strategy", "one_program")
    report = deviceless.compile_for(
        make_experiment(config), targets.load("h200x2"), log=lambda m: None, only=("chunk",)
    )
    (chunk,) = report.executables
    assert chunk.kernel_members == (3,) and chunk.collectives == {} and chunk.kernels["mhjax_attention_fwd"] == 2
    odd = set_field(tiny_sequence_config(heads=(1,), seed=(0, 1, 2)), "attention", "pallas")
    set_field(odd, "model.seq_len", 12)
    report = deviceless.compile_for(make_experiment(odd), targets.load("h200x2"), log=lambda m: None, only=("chunk",))
    (chunk,) = report.executables
    assert chunk.replicated and chunk.kernel_members == (3,)


def test_tpu_slices_are_targets_and_a_missing_tpu_compiler_is_one_line(capsys, monkeypatch):
    """v5e-4 and v5e-8: libtpu's compile-only devices, planned for 4 and 8 chips of 16 GiB."""
    from mhjax import cli

    four, eight = targets.load("v5e-4"), targets.load("v5e-8")
    assert (four.backend, four.count, four.topology, four.compiler) == ("tpu", 4, "v5e:2x2", "TPU")
    assert (eight.count, eight.topology, eight.memory_bytes) == (8, "v5e:2x4", 16 * 2**30)
    monkeypatch.setattr(targets, "tpu_compiler_available", lambda: False)
    code = cli.main(["train", "--config", "quick", "--dry-run", "--target", "v5e-8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1
    assert err[0].startswith('mhjax: error: --target: the TPU compiler is not installed; pip install "jax[tpu]==')


@pytest.mark.slow  # ~100 s on 2 cores; needs jax[tpu] (libtpu), which CI does not install
@pytest.mark.skipif(not targets.tpu_compiler_available(), reason=f"no TPU compiler here; {targets.install_hint('tpu')}")
def test_a_sweep_compiled_for_a_v5e_slice_is_split_over_its_chips_with_the_tpu_cost_analysis():
    config = set_field(tiny_sequence_config(heads=(1, 4), seed=(0, 1)), "strategy", "auto")
    report = deviceless.compile_for(make_experiment(config), targets.load("v5e-4"), log=lambda m: None)
    chunks = [e for e in report.executables if e.key[0] == "chunk"]
    assert chunks and all(not e.collectives and not e.replicated for e in chunks)
    assert all(e.cost.get("flops", 0) > 0 and e.cost.get("bytes accessed", 0) > 0 for e in chunks)
    text = "\n".join(deviceless.lines(report))
    assert "4 x TPU v5 lite (v5e-4)" in text and "TPU compiler's cost analysis" in text


def test_train_help_names_every_target_and_what_it_needs(capsys):
    """--help lists each bundled GPU target, NAMExN and each TPU slice with its install extra."""
    from mhjax import cli

    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for name in [*targets.bundled(), *targets.TPUS, "NAMExN", "jax[cuda13]", "jax[tpu]"]:
        assert name in text, name


# A TPU chunk as libtpu prints it: no known trip count (its condition compares the counter with
# a constant), a matmul as a convolution inside a fusion, a Pallas TPU call with its own estimate.
TPU_HLO = """HloModule jit_chunk

%cond (c: (s32[], f32[4,8])) -> pred[] {
  %c = (s32[], f32[4,8]{1,0:T(8,128)}) parameter(0)
  %n = s32[]{:T(128)} constant(3)
  %i = s32[]{:T(128)} get-tuple-element(%c), index=0
  ROOT %lt = pred[]{:T(512)} compare(%i, %n), direction=LT
}

%fused (q: f32[4,8], w: f32[8,16]) -> f32[4,16] {
  %q = f32[4,8]{1,0} parameter(0)
  %w = f32[8,16]{1,0} parameter(1)
  ROOT %conv = f32[4,16]{1,0} convolution(%q, %w), dim_labels=bf_io->bf
}

%body (p: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %p = (s32[], f32[4,8]{1,0}) parameter(0)
  %x = f32[4,8]{1,0} get-tuple-element(%p), index=1
  %w0 = f32[8,16]{1,0} constant({...})
  %f = f32[4,16]{1,0} fusion(%x, %w0), kind=kOutput, calls=%fused
  %jvp_jit_flash_attention__.2 = (f32[4,8]{1,0}, f32[4,128]{1,0}) custom-call(%x), TPU_CALL(1000)
  %flash_mha_bwd_dq_block_q_major_128_block_k_128.3 = f32[4,8]{1,0} custom-call(%x), TPU_CALL(500)
  ROOT %t = (s32[], f32[4,8]{1,0}) tuple(%i, %x)
}

ENTRY %main (a: f32[4,8]) -> f32[4,8] {
  %a = f32[4,8]{1,0} parameter(0)
  %w = (s32[], f32[4,8]{1,0}) while(%t0), condition=%cond, body=%body
  ROOT %r = f32[4,8]{1,0} get-tuple-element(%w), index=1
}
"""
for flops in (1000, 500):
    TPU_HLO = TPU_HLO.replace(
        f"TPU_CALL({flops})",
        'custom_call_target="tpu_custom_call", backend_config={"custom_call_config":{"body":"xyz",'
        f'"cost_estimate":{{"flops":"{flops}","transcendentals":"1"}}}}}}',
    )


def test_a_tpu_programs_pallas_calls_are_named_and_its_loops_counted_per_trip():
    """The TPU's HLO states no trip count: the condition's constant gives it (3 trips), so the
    FLOPs are 3 x (the (4, 8) x (8, 16) matmul's 2 * 4 * 16 * 8 and the calls' 1,000 + 500), and
    the Pallas TPU calls' bytes are the kernels' share of the step's bytes."""
    from mhjax.train import hlo_flops

    assert hlo.tpu_kernels(TPU_HLO) == {"flash_attention": 1, "flash_mha_bwd_dq": 1}
    assert hlo_flops.matmul_flops(TPU_HLO) == 3 * (2 * 4 * 16 * 8 + 1000 + 500)
    rest, kernels = hlo.split_bytes(TPU_HLO, weighted=True)
    assert kernels == 3 * ((4 * 8 + 4 * 128) * 4 + 4 * 8 * 4 + 2 * 4 * 8 * 4)  # results and operands, per trip
    # the fusion's result and operands, and the condition's compare (pred of two s32), per trip
    assert rest == 3 * ((4 * 16 + 4 * 8 + 8 * 16) * 4 + 1 + 4 + 4)


HBM_HLO = """HloModule jit_chunk

%stack (buf: f32[4,8,128], x: f32[8,128], i: s32[], res: f32[4,8,128], y: f32[8,128]) -> (f32[4,8,128], f32[4,8,128]) {
  %buf = f32[4,8,128]{2,1,0:T(8,128)} parameter(0)
  %x = f32[8,128]{1,0:T(8,128)} parameter(1)
  %i = s32[]{:T(128)} parameter(2)
  %res = f32[4,8,128]{2,1,0:T(8,128)} parameter(3)
  %y = f32[8,128]{1,0:T(8,128)} parameter(4)
  %z = s32[]{:T(128)} constant(0)
  %e = f32[8,128]{1,0:T(8,128)} exponential(%x)
  %b = f32[1,8,128]{2,1,0:T(8,128)} bitcast(%e)
  %u = f32[4,8,128]{2,1,0:T(8,128)} dynamic-update-slice(%buf, %b, %i, %z, %z)
  %by = f32[1,8,128]{2,1,0:T(8,128)} bitcast(%y)
  %v = f32[4,8,128]{2,1,0:T(8,128)} dynamic-update-slice(%res, %by, %i, %z, %z)
  ROOT %t = (f32[4,8,128]{2,1,0:T(8,128)}, f32[4,8,128]{2,1,0:T(8,128)}) tuple(%u, %v)
}

ENTRY %main (a: f32[4,8,128], h: f32[8,128], k: s32[], r: f32[4,8,128]) -> f32[8,128] {
  %a = f32[4,8,128]{2,1,0:T(8,128)} parameter(0)
  %h = f32[8,128]{1,0:T(8,128)} parameter(1)
  %k = s32[]{:T(128)} parameter(2)
  %r = f32[4,8,128]{2,1,0:T(8,128)} parameter(3)
  %cs = (f32[8,128]{1,0:T(8,128)}, f32[8,128]{1,0:T(8,128)S(1)}, u32[]{:S(2)}) copy-start(%h)
  %cd = f32[8,128]{1,0:T(8,128)S(1)} copy-done(%cs)
  %n = f32[8,128]{1,0:T(8,128)S(1)} negate(%cd)
  %f = (f32[4,8,128]{2,1,0:T(8,128)}, f32[4,8,128]{2,1,0:T(8,128)}) fusion(%a, %n, %k, %r, %h), kind=kLoop, calls=%stack
  %c = f32[8,128]{1,0:T(8,128)} custom-call(%a), custom_call_target="tpu_custom_call", \
backend_config={"custom_call_config":{"cost_estimate":{"flops":"10","transcendentals":"0","bytes_accessed":"777"}}}
  ROOT %o = f32[8,128]{1,0:T(8,128)} add(%c, %h)
}
""".replace("\\\n", "")


def test_a_tpu_programs_hbm_bytes_skip_vmem_copy_once_update_in_place_and_take_a_kernels_word():
    """On a TPU (train/hlo.py): a value in VMEM (S(1)) moves no HBM bytes (the negate reads and
    writes VMEM only); an async copy is charged at its start, once (read in HBM, write in VMEM:
    4 KiB); a fusion whose root tuple holds two dynamic-update-slices of its parameters writes
    the two 4 KiB slices and reads what feeds them (its VMEM operand, none; the (8, 128) HBM one,
    4 KiB), never the (4, 8, 128) stacks; a Pallas call with a cost estimate is charged its 777
    stated bytes, not its 16 KiB operand."""
    slab = 8 * 128 * 4
    moved = {line.split(" = ")[0].strip(): b for line, _, b in hlo.kernels(HBM_HLO)}
    assert moved["%cs"] == slab and "%cd" not in moved and moved["%n"] == 0
    assert moved["%f"] == 2 * slab + slab + 4  # the two slices written; y and the index read
    assert moved["%c"] == 777
    assert moved["%o"] == 3 * slab


@pytest.mark.slow  # four small compiles for a v5e (~40 s on 2 cores); needs jax[tpu] (libtpu), not in CI
@pytest.mark.skipif(not targets.tpu_compiler_available(), reason=f"no TPU compiler here; {targets.install_hint('tpu')}")
def test_a_v5e_chunk_runs_the_pallas_tpu_kernel_and_its_flops_are_counted_per_member_step():
    """attention=auto with dropout: the chunk holds the Pallas TPU kernel's forward and
    backward calls and no (T, T) value; the JAX path its maps. The TPU compiler's cost analysis counts
    every loop body once (a 1- and a 2-step chunk: the same FLOPs; scanned layers: one of two),
    while hlo_flops counts per trip: the same per member-step at 1 and 2 steps, scanned or not,
    and near models/flops.py's matmuls (the JAX path at T = 8: nothing padded)."""
    from mhjax.models import flops

    def chunk(steps, attention="jax", dropout=0.0, scan="on"):
        config = set_field(tiny_sequence_config(heads=(4,), seed=(0, 1, 2, 3)), "strategy", "one_program")
        for field, value in [("model.dropout", dropout), ("model.scan_layers", scan), ("model.num_layers", 2)]:
            set_field(config, field, value)
        for field, value in [("attention", attention), ("train.steps", steps), ("train.chunk_steps", steps)]:
            set_field(config, field, value)
        report = deviceless.compile_for(
            make_experiment(config), targets.load("v5e-4"), log=lambda m: None, only=("chunk",)
        )
        return config, report.executables[0]

    config, one = chunk(1)
    _, two = chunk(2)
    _, unrolled = chunk(1, scan="off")
    assert one.cost["flops"] == pytest.approx(two.cost["flops"], rel=1e-3)  # the step loop's body once
    assert one.cost["flops"] < 0.8 * unrolled.cost["flops"]  # the scanned layers' body once
    m, d = config.model, config.data
    analytic = flops.train_step_flops(d.batch_size, m.seq_len, m.width, m.num_layers, m.mlp_dim, m.vocab_size)
    for e in (one, two, unrolled):
        assert e.flops_per_member_step == pytest.approx(one.flops_per_member_step, rel=1e-3)
    assert analytic <= one.flops_per_member_step <= 1.5 * analytic  # its mixing of heads and the loss's extras
    assert one.square > 0 and not one.kernels  # the JAX path's (T, T) maps
    _, kernel = chunk(1, attention="auto", dropout=0.1)  # auto on a TPU: mhjax's kernel, dropout on chip
    assert kernel.kernels == {"mhjax_tpu_attention_fwd": 1, "mhjax_tpu_attention_bwd": 1}
    assert kernel.square == 0 and kernel.flops_per_member_step > 0
    # the calls' bytes are their cost estimates (hlo.KERNEL_BYTES): below the whole operands
    assert 0 < kernel.kernel_bytes_per_member_step < one.bytes_per_member_step
