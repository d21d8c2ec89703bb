"""The TPU kernel's VMEM need and the chip's limit (models/tpu_vmem.py), and what the planner
does with them before anything compiles: auto on a TPU takes the JAX path where the kernel
would not fit (and only where that path fits HBM), pallas is refused, and a compile that fails
anyway is one line, exit 1 (train/deviceless.py)."""

import types

import pytest

import mhjax
from mhjax import cli
from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.models import tpu_vmem
from mhjax.models.attention_choice import resolve_attention
from mhjax.plan import attention
from mhjax.plan.shapes import SweepShapes
from mhjax.train import deviceless
from mhjax.train import target as targets

MIB = 2**20


def test_the_limit_is_three_quarters_of_each_chips_vmem_and_none_for_an_unknown_chip():
    assert tpu_vmem.limit("TPU v5 lite") == 96 * MIB and tpu_vmem.limit("TPU v6 lite") == 96 * MIB
    assert tpu_vmem.limit("TPU v5p") == 48 * MIB and tpu_vmem.limit("TPU v4") == 12 * MIB
    assert tpu_vmem.limit("TPU v99") is None
    with tpu_vmem.for_chip("TPU v4"):  # a deviceless compile's target, not this machine's
        assert tpu_vmem.chip() == "TPU v4" and tpu_vmem.limit() == 12 * MIB
    assert tpu_vmem.chip() is None and tpu_vmem.limit() == 96 * MIB  # a CPU here: the preset v5e


def test_the_need_is_a_padded_tiles_so_an_awkward_t_needs_what_the_next_tile_multiple_does():
    need = lambda t, itemsize=4, heads=16: tpu_vmem.need(t, 64, heads, itemsize)  # noqa: E731
    assert need(1021) == need(1024) and need(1000) == need(1024)
    assert need(2048)["forward"] == need(8192)["forward"]  # the forward's steps are tiles whatever T
    assert need(4096)["backward"] < need(8192)["backward"]  # the backward's (T, 3D) block grows
    assert need(8192, 2)["backward"] < need(8192, 4)["backward"]
    # a (rows, cols) value pads to (8 or 16 sublanes, 128 lanes): 100 x 192 float32 -> 104 x 256
    assert tpu_vmem._block(100, 192, 4) == 104 * 256 * 4 and tpu_vmem._block(100, 64, 2) == 112 * 128 * 2


def test_what_fits_is_the_longest_t_whose_need_is_under_the_limit():
    longest = tpu_vmem.longest_fitting(64, 16, 4, "TPU v5 lite")
    assert tpu_vmem.fits(longest, 64, 16, 4, "TPU v5 lite")
    assert not tpu_vmem.fits(longest + tpu_vmem.TILE, 64, 16, 4, "TPU v5 lite")
    assert tpu_vmem.longest_fitting(64, 16, 2, "TPU v5 lite") > longest  # bfloat16 halves the blocks
    assert tpu_vmem.refusal(8192, [(64, 1), (64, 16)], 4, "TPU v5 lite") is None
    line = tpu_vmem.refusal(4 * longest, [(64, 1), (64, 16)], 4, "TPU v5 lite")
    assert f"T <= {longest:,} at 16 heads" in line and "in bfloat16" in line and "limit 96 MiB" in line
    assert "\n" not in line


def test_auto_on_a_tpu_takes_jax_where_the_kernel_would_not_fit_and_pallas_is_refused():
    too_long = 4 * tpu_vmem.longest_fitting(64, 16, 4, "TPU v5 lite")
    # auto's choice is the planner's (plan/attention.KERNEL_FITS), from the sweep's shapes
    model = types.SimpleNamespace(width=64, attention_width=None)
    shapes = SweepShapes([model], [16], [], 50, 8192, 256, "float32", 0.1, "auto")
    fits = attention.choose(shapes, "tpu")
    assert (fits.implementation, fits.fallback) == ("pallas_tpu", None)
    refused = attention.choose(shapes._replace(seq_len=too_long), "tpu")
    assert refused.implementation == "jax" and "it fits T <=" in refused.fallback
    with pytest.raises(ConfigError, match=r"config.attention: pallas on tpu: the TPU kernel needs .* use auto or jax"):
        resolve_attention("pallas", "tpu", too_long, 0.1, [(64, 16)], 4)


def test_auto_on_a_tpu_whose_jax_path_would_not_fit_either_says_what_t_fits_before_compiling():
    too_long = 4 * tpu_vmem.longest_fitting(64, 16, 4, "TPU v5 lite")
    config = mhjax.load_config("paper", {"model.seq_len": too_long, "strategy": "one_program"})
    experiment = make_experiment(config)
    with pytest.raises(ConfigError, match=r"auto on tpu runs the JAX path .* it fits T <= .* more than the Google TPU"):
        experiment.programs("one_program", "tpu")


def test_a_compile_that_fails_anyway_is_one_line_naming_the_executable_and_the_allocation(monkeypatch, capsys):
    """Mosaic's message is pages of HLO; the dry run says the executable, the kernel and the
    allocation in one line and exits 1, no traceback (an out-of-memory compile is not tried
    again: deviceless.out_of_memory)."""
    message = (
        "RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\nRan out of memory in memory space vmem while "
        "allocating on stack for %transpose_jvp_mhjax_tpu_attention_bwd__.1 = f32[1,50,1021,192] custom-call(...)"
        "\nScoped allocation with size 21.25M and limit 16.00M exceeded scoped vmem limit by 5.25M.\n..."
    )
    assert deviceless.out_of_memory(RuntimeError(message))
    assert not deviceless.out_of_memory(RuntimeError("INTERNAL: Failed to launch ptxas"))
    line = deviceless.failure_line("chunk all 2", targets.load("v5e-8"), RuntimeError(message))
    assert line == (
        "compiling chunk all 2 for TPU v5 lite failed in mhjax_tpu_attention_bwd: Ran out of memory in memory "
        "space vmem; Scoped allocation with size 21.25M and limit 16.00M"
    )
    other = deviceless.failure_line("init", targets.load("v5e-8"), RuntimeError("INTERNAL: broken\nmore"))
    assert other == "compiling init for TPU v5 lite failed: RuntimeError: INTERNAL: broken"

    def failing(*args, **kwargs):
        raise deviceless.CompileFailed(line)

    monkeypatch.setattr(targets, "devices", lambda target, count=None: [])  # no libtpu needed here
    monkeypatch.setattr(deviceless, "compile_for", failing)
    assert cli.main(["train", "--config", "quick", "--dry-run", "--target", "v5e-8"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"mhjax: {line}" and not any("Traceback" in e for e in err)


def _compiles_within(limit: int, length: int, heads: int, dtype, backward: bool) -> bool:
    """Whether the kernel's forward (or forward and backward) compiles for one v5e chip under a
    scoped VMEM limit of ``limit`` bytes (B = 50, D = 64)."""
    import os

    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import SingleDeviceSharding

    from mhjax.models import pallas_tpu_attention

    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5litepod-8")
    chip = SingleDeviceSharding(topologies.get_topology_desc(topology_name="v5e:2x4", platform="tpu").devices[0])
    qkv = jax.ShapeDtypeStruct((1, 50, length, 192), dtype, sharding=chip)
    seeds = jax.ShapeDtypeStruct((1, heads, 2), jnp.uint32, sharding=chip)

    def loss(q, s):
        out = pallas_tpu_attention.members_attention(q, s, ((1, heads),), int(0.9 * (1 << 24)), 1 / 0.9, False)
        return jnp.sum(out.astype(jnp.float32))

    with pytest.MonkeyPatch.context() as patch, tpu_vmem.for_chip("TPU v5 lite"):
        patch.setattr(tpu_vmem, "limit", lambda device_kind=None: limit)
        try:
            jax.jit(jax.grad(loss) if backward else loss).lower(qkv, seeds).compile()
        except Exception as exc:  # noqa: BLE001
            if not deviceless.out_of_memory(exc):
                raise
            return False
    return True


@pytest.mark.slow  # ~40 deviceless compiles of the kernel alone (~2 minutes on 2 cores); needs libtpu, not in CI
@pytest.mark.skipif(not targets.tpu_compiler_available(), reason=f"no TPU compiler here; {targets.install_hint('tpu')}")
@pytest.mark.parametrize("length,heads,dtype", [(1021, 16, "float32"), (8192, 16, "float32")])
def test_the_need_bounds_what_mosaic_allocates(length, heads, dtype):
    """The smallest scoped limit at which each call compiles (bisected to 64 KiB) is at most
    tpu_vmem.need's, and not far below it where T is long (the resident blocks dominate)."""
    import jax.numpy as jnp

    need = tpu_vmem.need(length, 64, heads, jnp.dtype(dtype).itemsize)
    for call, backward in (("forward", False), ("backward", True)):
        low, high = 64 << 10, need[call]
        assert _compiles_within(high, length, heads, jnp.dtype(dtype), backward)
        while high - low > 64 << 10:
            middle = (low + high) // 2
            low, high = (
                (low, middle) if _compiles_within(middle, length, heads, jnp.dtype(dtype), backward) else (middle, high)
            )
        print(f"T = {length} {heads} heads {dtype} {call}: Mosaic {high / MIB:.2f} MiB, need {need[call] / MIB:.2f}")
        assert high <= need[call] and (length < 4096 or need[call] < 1.2 * high)
