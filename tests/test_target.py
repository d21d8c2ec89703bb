"""`mhjax train --dry-run --target`: compiling a sweep for a GPU that is not here (train/target.py,
train/deviceless.py, train/hlo.py). The compile test needs the GPU compiler (jax[cuda13]); CI
installs it (.ci/run), a checkout without it skips that test and says how to install it."""

import re

import jax
import pytest

from mhjax import cli
from mhjax.config import ConfigError
from mhjax.train import deviceless, hlo
from mhjax.train import target as targets
from tests.conftest import config_source, set_field, tiny_sequence_config

NEEDS_COMPILER = pytest.mark.skipif(
    not targets.compiler_available(), reason=f"no GPU compiler here; {targets.install_hint()}"
)

# A hand-written optimised module: a 3-step loop whose body runs one fusion and one Triton call.
HLO = """HloModule jit_chunk

%body (p: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %p = (s32[], f32[4,8]{1,0}) parameter(0)
  %x = f32[4,8]{1,0} get-tuple-element(%p), index=1
  %i = s32[] get-tuple-element(%p), index=0
  %f = f32[4,8]{1,0} fusion(%x), kind=kLoop, calls=%fused
  %k = (f32[4,8]{1,0}, f32[2,12,12]{2,1,0}) custom-call(%f), custom_call_target="__gpu$xla.gpu.triton", TRITON
  ROOT %t = (s32[], f32[4,8]{1,0}) tuple(%i, %f)
}

ENTRY %main (a: f32[4,8]) -> f32[4,8] {
  %a = f32[4,8]{1,0} parameter(0)
  %c = f32[4,8]{1,0} copy(%a)
  %w = (s32[], f32[4,8]{1,0}) while(%t0), condition=%cond, body=%body, backend_config={"known_trip_count":{"n":"3"}}
  ROOT %r = f32[4,8]{1,0} get-tuple-element(%w), index=1
}
""".replace("TRITON", 'backend_config={grid = 1, name = "mhjax_attention_fwd"}')


def test_bundled_targets_load_with_their_device_and_memory():
    assert {"h200", "h100", "a100"} <= set(targets.bundled())
    h200 = targets.load("h200")
    assert h200.device == "NVIDIA H200" and h200.memory_bytes == 150754820096 and h200.backend == "gpu"
    assert targets.load("a100").memory_bytes < h200.memory_bytes


def test_a_target_file_loads_and_a_bad_name_or_file_is_a_one_line_config_error(tmp_path):
    own = tmp_path / "mine.textproto"
    own.write_text(targets.load("h100").text.replace('"NVIDIA H100 80GB HBM3"', '"My GPU"'))
    assert targets.load(str(own)).device == "My GPU"
    with pytest.raises(ConfigError, match=r"--target: must be one of a100, h100, h200"):
        targets.load("h300")
    junk = tmp_path / "junk.txt"
    junk.write_text("core_count: 3\n")
    with pytest.raises(ConfigError, match="not a GpuTargetConfig"):
        targets.load(str(junk))


def test_hlo_reading_counts_bytes_kernels_and_square_maps():
    assert hlo.type_bytes("(f32[4,8]{1,0}, u32[2])") == 4 * 32 + 8
    # top level: copy (2 x 128 B) in the entry; fusion (2 x 128) and the Triton call
    # (128 in, 128 + 2*12*12*4 out) in the loop body; nothing inside fusions.
    body = 2 * 128 + 128 + 128 + 2 * 144 * 4
    assert hlo.kernel_bytes(HLO) == 2 * 128 + body
    assert dict(hlo.triton_kernels(HLO)) == {"mhjax_attention_fwd": 1}
    assert hlo.square_tensors(HLO, 12) == 1 and hlo.square_tensors(HLO, 8) == 0
    masks = HLO + "  %m = pred[2,12,12]{2,1,0} compare(%x, %x)\n  %u = u32[12,12]{1,0} add(%y, %y)\n"
    assert hlo.square_tensors(masks, 12) == 3  # any element type: dropout masks and hash bits too
    # per step of a 3-step chunk: the body once per trip, the entry once, over 3 steps
    assert deviceless.step_bytes(HLO, 3) == pytest.approx((3 * body + 2 * 128) / 3)


# A scan's backward reading layer i of a (4, 8, 16) stack of saved residuals: a fusion whose root
# copies the dynamic-slice, and one that reads the stack only through a dynamic-slice.
STACKED = """HloModule jit_chunk

%fused_slice (p0: f32[4,8,16], p1: s32[]) -> f32[1,8,16] {
  %p0 = f32[4,8,16]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = f32[1,8,16]{2,1,0} dynamic-slice(%p0, %p1, %z, %z), dynamic_slice_sizes={1,8,16}
  ROOT %c = f32[1,8,16]{2,1,0} copy(%ds)
}

%fused_use (q0: f32[4,8,16], q1: s32[], q2: f32[1,8,16]) -> f32[1,8,16] {
  %q0 = f32[4,8,16]{2,1,0} parameter(0)
  %q1 = s32[] parameter(1)
  %q2 = f32[1,8,16]{2,1,0} parameter(2)
  %z = s32[] constant(0)
  %ds = f32[1,8,16]{2,1,0} dynamic-slice(%q0, %q1, %z, %z), dynamic_slice_sizes={1,8,16}
  ROOT %m = f32[1,8,16]{2,1,0} multiply(%ds, %q2)
}

ENTRY %main (a: f32[4,8,16], i: s32[], g: f32[1,8,16]) -> f32[1,8,16] {
  %a = f32[4,8,16]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %g = f32[1,8,16]{2,1,0} parameter(2)
  %s = f32[1,8,16]{2,1,0} fusion(%a, %i), kind=kCustom, calls=%fused_slice
  ROOT %u = f32[1,8,16]{2,1,0} fusion(%a, %i, %g), kind=kLoop, calls=%fused_use
}
"""


def test_a_stack_read_through_a_dynamic_slice_is_charged_the_slice():
    layer = 8 * 16 * 4
    # copy of the slice: read one layer, write one; the other fusion: one layer, the index, g, out
    assert hlo.kernel_bytes(STACKED) == (2 * layer + 4) + (layer + 4 + layer + layer)


def test_a_missing_gpu_compiler_is_one_line_naming_the_install_command(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(targets, "compiler_available", lambda: False)
    path = tmp_path / "tiny.py"
    path.write_text(config_source(tiny_sequence_config()))
    assert cli.main(["train", "--config", str(path), "--dry-run", "--target", "h200"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f'mhjax: error: --target: the GPU compiler is not installed; pip install "jax[cuda13]=={jax.__version__}"'
    ]


def test_target_needs_dry_run(tmp_path, capsys):
    path = tmp_path / "tiny.py"
    path.write_text(config_source(tiny_sequence_config()))
    assert cli.main(["train", "--config", str(path), "--target", "h200"]) == 2
    assert "--target: only with --dry-run" in capsys.readouterr().err


@NEEDS_COMPILER
def test_a_small_pallas_sweep_compiles_for_the_h200_with_the_kernel_and_no_attention_map(tmp_path, capsys):
    """The Pallas kernel through Triton and ptxas for sm_90, on this CPU: every executable
    compiles, the training program calls the kernel forward and backward for each head count,
    and no (..., T, T) value of any type is left (the JAX path has them: the check can fail)."""
    length = 12  # no other dimension of the model is 12
    config = set_field(set_field(tiny_sequence_config(), "model.seq_len", length), "attention", "pallas")
    set_field(config, "strategy", "one_program")
    path = tmp_path / "tiny.py"
    path.write_text(config_source(config))
    assert cli.main(["train", "--config", str(path), "--dry-run", "--target", "h200"]) == 0
    out = capsys.readouterr().out
    chunk = next(line for line in out.splitlines() if line.strip().startswith("chunk all 3"))
    # one_program with heads (1, 4): a kernel call per head-count group, forward and backward
    assert "mhjax_attention_bwd x2, mhjax_attention_fwd x2" in chunk and "no (T, T) map" in chunk
    assert "compile:" in out and "fits in 140.40 GiB" in out and "bytes per member-step" in out

    from mhjax.experiments import make_experiment

    jax_path = make_experiment(set_field(config, "attention", "jax"))
    report = deviceless.compile_for(jax_path, targets.load("h200"), log=lambda m: None, only=("chunk",))
    (chunk,) = report.executables
    assert not chunk.kernels and chunk.square > 0


@NEEDS_COMPILER
def test_a_long_sequence_sweep_compiles_for_the_h200_with_the_tiled_kernel_and_no_t_by_t_value():
    """T = 1,024 (16 forward tiles): attention=auto on the H200 picks the Pallas kernel (no
    length limit), the training chunk calls it forward and backward for each head-count group
    of one_program and holds no (..., T, T) value of any type (scores, masks, hash bits), and
    its temporary memory is far below one f32 (B, H, T, T) map per layer."""
    length = 1024
    config = set_field(set_field(tiny_sequence_config(), "model.seq_len", length), "strategy", "one_program")
    from mhjax.experiments import make_experiment

    report = deviceless.compile_for(make_experiment(config), targets.load("h200"), log=lambda m: None, only=("chunk",))
    (chunk,) = report.executables
    attention = {name: n for name, n in chunk.kernels.items() if name.startswith("mhjax_attention")}
    assert attention == {"mhjax_attention_fwd": 2, "mhjax_attention_bwd": 2} and chunk.square == 0
    batch, heads, members = 4, 4, 2  # tiny_sequence_config: batch 4, heads (1, 4), one member each
    assert chunk.temp < members * batch * heads * length * length * 4 / 4


@NEEDS_COMPILER
def test_target_programs_compile_two_at_a_time_and_a_failed_compile_is_tried_once_more(monkeypatch):
    """The dry run compiles a target's programs side by side (deviceless.COMPILERS) and reports
    each; a compile that fails (as XLA:GPU once failed to launch ptxas beside another compile)
    is tried once more and says so, and one that fails again is raised."""
    from mhjax.experiments import make_experiment
    from mhjax.train import ahead

    compile_all, failed, running, most = ahead.compile_all, [], [0], [0]

    def flaky(jobs, *args, **kwargs):
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            if jobs[0].key[0] in failing and jobs[0].key not in failed:
                failed.append(jobs[0].key)
                raise RuntimeError("INTERNAL: Failed to launch ptxas")
            return compile_all(jobs, *args, **kwargs)
        finally:
            running[0] -= 1

    monkeypatch.setattr(ahead, "compile_all", flaky)
    config = set_field(tiny_sequence_config(heads=(2,)), "strategy", "one_program")
    failing, said = {"chunk"}, []
    report = deviceless.compile_for(make_experiment(config), targets.load("h200"), log=said.append)
    keys = [e.key[0] for e in report.executables]
    assert "chunk" in keys and "init" in keys and report.wall > 0 and most[0] == deviceless.COMPILERS
    assert any(
        line.startswith("compiling chunk") and "again (RuntimeError: INTERNAL: Failed to launch" in line
        for line in said
    )
    monkeypatch.setattr(ahead, "compile_all", lambda jobs, *a, **k: (_ for _ in ()).throw(RuntimeError("broken")))
    with pytest.raises(RuntimeError, match="broken"):
        deviceless.compile_for(make_experiment(config), targets.load("h200"), log=said.append, only=("chunk",))


def test_jax_plugin_errors_stay_off_the_console_and_go_to_mhjax_log(tmp_path, caplog):
    """With jax[cuda13] on a machine without a GPU, JAX logs a cuPTI traceback at backend start:
    held by io/plugin_log.py (installed by the CLI) and written to the workdir's mhjax.log."""
    import logging

    from mhjax.io import plugin_log
    from mhjax.workflows.train import library_logs

    plugin_log.hold()
    logger = logging.getLogger(plugin_log.LOGGER)
    try:
        raise RuntimeError("Unable to load cuPTI. Is it installed?")
    except RuntimeError:
        logger.exception("Jax plugin configuration error: Exception when calling %s.initialize()", "xla_cuda13")
    logger.warning("another record of that logger still shows")
    shown = " ".join(caplog.messages)  # what reached the root logger's handlers (the console)
    assert "plugin configuration" not in shown and "still shows" in shown
    log = tmp_path / "mhjax.log"
    with library_logs(str(log)):
        pass
    assert "Jax plugin configuration error" in log.read_text() and "Unable to load cuPTI" in log.read_text()


@NEEDS_COMPILER
@pytest.mark.slow
def test_heads_by_head_dim_dry_run_for_the_h200_lists_the_shape_groups_and_compiles_each(tmp_path, capsys):
    """heads 1,4 x head_dim 8,16 (issue 38): the four shape groups (attention widths 8, 16, 32,
    64) listed with their members and H200 prediction, each group's programs compiled for the
    H200 with the Pallas kernels (head size 8 pads to 16 and fits), and the parameter counts the
    members' lines give are the hand counts."""
    from tests.test_architecture import hand_count

    path = tmp_path / "tiny.py"
    path.write_text(config_source(tiny_sequence_config(heads=(1, 4), head_dim=(8, 16))))
    assert (
        cli.main(["train", "--config", str(path), "--workdir", str(tmp_path / "w"), "--dry-run", "--target", "h200"])
        == 0
    )
    out = capsys.readouterr().out
    assert "4 shape groups" in out
    groups = re.findall(
        r"^  (a\d+): .*attention width (\d+) \(head size (\d+)\); 1 member\(s\) at heads (\d+); programs (\S+);",
        out,
        re.M,
    )
    assert [(g, int(a), int(d), int(h), p) for g, a, d, h, p in groups] == [
        ("a8", 8, 8, 1, "a8-h1"),
        ("a16", 16, 16, 1, "a16-h1"),
        ("a32", 32, 8, 4, "a32-h4"),
        ("a64", 64, 16, 4, "a64-h4"),
    ]
    assert all("on one NVIDIA H200" in line for line in out.splitlines() if re.match(r"^  a\d+: ", line))
    for program in ("a8-h1", "a16-h1", "a32-h4", "a64-h4"):
        rows = [line.split() for line in out.splitlines() if line.split()[1:2] == [program]]
        assert [r[0] for r in rows] == ["init", "chunk", "evaluate"], program
        chunk = next(line for line in out.splitlines() if line.strip().startswith(f"chunk {program} 3"))
        assert "mhjax_attention_fwd x1" in chunk and "mhjax_attention_bwd x1" in chunk, chunk
    assert "for 12 executables; memory: fits in 140.40 GiB" in out
    for name, attention in (
        ("copy-d8-h1-s0", 8),
        ("copy-d8-h4-s0", 32),
        ("copy-d16-h1-s0", 16),
        ("copy-d16-h4-s0", 64),
    ):
        assert re.search(rf"^{name}\s+{hand_count(16, 1, 32, 16, 8, attention):,}\s", out, re.M), name


@NEEDS_COMPILER
def test_the_python_api_is_as_quiet_as_the_cli_with_the_gpu_compiler_installed(tmp_path):
    """A fresh `python -c` of mhjax.sweep with jax[cuda13] and no GPU: JAX's cuPTI traceback is
    held from `import mhjax` on (mhjax/__init__.py) and lands in the workdir's mhjax.log."""
    import os
    import subprocess
    import sys

    from tests.conftest import ROOT

    workdir = tmp_path / "w"
    script = (
        "import sys, mhjax\n"
        'config = mhjax.load_config("quick", {"sweep.task": ("copy",), "sweep.heads": (1,), "train.steps": 2,\n'
        '    "train.chunk_steps": 2, "model.seq_len": 8, "model.width": 16, "data.num_eval": 8})\n'
        "mhjax.sweep(config, sys.argv[1], progress=False)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # JAX starts its GPU plugin
    env["PYTHONPATH"] = ROOT
    result = subprocess.run(
        [sys.executable, "-c", script, str(workdir)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "plugin configuration" not in result.stderr, result.stderr[-3000:]
    assert "Jax plugin configuration error" in (workdir / "mhjax.log").read_text()


@NEEDS_COMPILER
def test_the_block_kernels_rule_is_what_the_h200_compiles():
    """pallas_block.fits against the compiler, both sides of each budget: a shape the rule gives
    the kernel compiles for the H200; one it leaves to XLA runs out of shared memory."""
    import importlib.util
    import os

    from mhjax.models import pallas_block
    from tests.conftest import ROOT

    spec = importlib.util.spec_from_file_location(
        "block_fit", os.path.join(ROOT, "benchmarks", "studies", "block_fit.py")
    )
    block_fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(block_fit)
    for kind, width, hidden in (
        ("norm_dense", 128, 256),
        ("norm_dense", 256, 256),
        ("mlp_block", 64, 128),
        ("mlp_block", 64, 256),
    ):
        verdict = block_fit.compiles(kind, width, hidden)
        if pallas_block.fits(width, hidden, kind):
            assert verdict == "ok", (kind, width, hidden, verdict)
        else:
            assert "Shared memory size limit exceeded" in verdict, (kind, width, hidden, verdict)


def test_the_bytes_line_prints_the_models_error_only_against_a_count():
    """A TPU's Pallas calls state their bytes: the chunk's total is a count, printed with
    models/cost.py's error; a GPU's Triton calls are charged every member's operands (an upper
    bound): the rest is given beside them and the model's total without an error."""
    chunk = deviceless.Executable(("chunk", "all", 200), 1.0, 0, 0, 0, 0, {"k": 1}, 0, 0.15e9, 0.6e9)

    def line(name):
        report = deviceless.Report(targets.load(name), "", [chunk], 0.3e9, 100, {"all": 8})
        return next(x for x in deviceless.lines(report) if x.startswith("bytes per member-step"))

    gpu, tpu = line("h200"), line("v5e-8")
    assert "0.150 GB besides the Pallas kernels' calls (0.600 GB at most" in gpu and "error" not in gpu
    assert "0.750 GB, of it the Pallas kernels' calls 0.600 GB (their stated bytes, HBM's share)" in tpu
    assert tpu.endswith("models/cost.py: 0.300 GB, error -60.0%")
