"""The TPU bytes line (train/hlo.py) follows its own rule: a value in VMEM moves nothing, a
buffer set aside (AllocateBuffer) moves nothing, and a Pallas call's stated bytes count only in
the share of its operands and results that lie in HBM. Checked against tests/hbm_count.py, an
independent count of the same HLO, on a hand-written program (default run) and on the compiled
paper chunk for a v5e-8 (slow; needs libtpu)."""

import pytest

import mhjax
from mhjax.experiments import make_experiment
from mhjax.train import deviceless, hlo
from mhjax.train import target as targets
from tests import hbm_count

CALL = (
    'custom_call_target="tpu_custom_call", backend_config={"custom_call_config":{"cost_estimate":'
    '{"flops":"10","transcendentals":"0","bytes_accessed":"STATED"}}}'
)
# Two group calls of a 4-member program (2 members each, the second writing into the first's
# output); the first reads and writes VMEM only, the second writes its result to HBM; an
# AllocateBuffer and an add that reads the HBM result.
PROGRAM = """HloModule jit_chunk

ENTRY %main (a: f32[4,8,128]) -> f32[4,8,128] {
  %a = f32[4,8,128]{2,1,0:T(8,128)} parameter(0)
  %v = f32[4,8,128]{2,1,0:T(8,128)S(1)} negate(%a)
  %scratch = f32[4,8,128]{2,1,0:T(8,128)S(1)} custom-call(), custom_call_target="AllocateBuffer"
  %fwd.1 = (f32[4,8,128]{2,1,0:T(8,128)S(1)}, f32[2,8,1]{2,1,0:T(8,128)S(1)}) custom-call(%v, %v), CALL1
  %o = f32[4,8,128]{2,1,0:T(8,128)S(1)} get-tuple-element(%fwd.1), index=0
  %fwd.2 = (f32[4,8,128]{2,1,0:T(8,128)}, f32[2,8,1]{2,1,0:T(8,128)S(1)}) custom-call(%v, %v, %o), \
output_to_operand_aliasing={{0}: (2, {})}, CALL2
  %r = f32[4,8,128]{2,1,0:T(8,128)} get-tuple-element(%fwd.2), index=0
  ROOT %s = f32[4,8,128]{2,1,0:T(8,128)} add(%r, %a)
}
""".replace("\\\n", "")
SLAB = 4 * 8 * 128 * 4  # one (4, 8, 128) float32 array
STATED = SLAB * 3 // 2  # each call: its 2 members' share of two reads and a write
PROGRAM = PROGRAM.replace("CALL1", CALL.replace("STATED", str(STATED)))
PROGRAM = PROGRAM.replace("CALL2", CALL.replace("STATED", str(STATED)))


def test_values_in_vmem_and_allocated_buffers_move_nothing_and_a_call_is_charged_its_hbm_share():
    moved = {line.split(" = ")[0].strip(): b for line, _, b in hlo.kernels(PROGRAM)}
    assert moved["%v"] == SLAB  # reads a in HBM, writes VMEM
    assert "%scratch" not in moved  # AllocateBuffer: no data moves
    assert moved["%fwd.1"] == 0  # every operand and result in VMEM
    # the second call: of its operands and results (v, v, o, result, statistics: 4 slabs and the
    # statistics' 2 x 8 x 1 floats) only the result lies in HBM
    share = SLAB / (4 * SLAB + 2 * 8 * 4)
    assert moved["%fwd.2"] == pytest.approx(STATED * share)
    assert moved["%s"] == 3 * SLAB
    rest, kernels = hlo.split_bytes(PROGRAM)
    assert rest == 4 * SLAB and kernels == pytest.approx(STATED * share)
    # the independent count: the second call writes its 2 members' half of the result
    independent = hbm_count.count(PROGRAM)
    assert independent == (4 * SLAB, SLAB / 2)


@pytest.mark.slow  # one chunk compile for a v5e-8 (~2 minutes on 2 cores); needs jax[tpu] (libtpu), not in CI
@pytest.mark.skipif(not targets.tpu_compiler_available(), reason=f"no TPU compiler here; {targets.install_hint('tpu')}")
def test_the_paper_chunks_bytes_line_equals_an_independent_count_of_its_hbm_operands_and_results():
    """The paper sweep (8 seeds, 64 members, 8 per chip) for a v5e-8: the bytes line per
    member-step within 5 % of tests/hbm_count.py's count of the compiled chunk's HLO."""
    config = mhjax.load_config("paper", {"sweep.seed": tuple(range(8))})
    texts = []
    describe = deviceless._describe

    def keep(key, executable, *args, **kwargs):
        texts.append(executable.as_text())
        return describe(key, executable, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(deviceless, "_describe", keep)
        report = deviceless.compile_for(
            make_experiment(config), targets.load("v5e-8"), log=lambda m: None, only=("chunk",)
        )
    (chunk,) = report.executables
    steps, members = chunk.key[2], report.members[chunk.key[1]]
    line = chunk.bytes_per_member_step + chunk.kernel_bytes_per_member_step
    independent = sum(hbm_count.count(texts[0])) / steps / members
    print(f"bytes line {line / 1e9:.4f} GB, independent count {independent / 1e9:.4f} GB per member-step")
    assert line == pytest.approx(independent, rel=0.05)
