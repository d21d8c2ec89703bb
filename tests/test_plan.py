"""The planner (mhjax/plan/): auto's kernel choice asks one place whether the backend's kernel fits
the sweep, a plan without the kernel keeps its programs' members, and an experiment without
shapes is planned as it lays itself out."""

from mhjax.experiments import make_experiment
from mhjax.plan import attention
from tests.conftest import set_field, tiny_sequence_config
from tests.test_mixture_sweep import tiny_mixture_config


def _auto(**fields):
    return make_experiment(
        set_field(set_field(tiny_sequence_config(**fields), "strategy", "auto"), "attention", "auto")
    )


def test_a_kernel_that_does_not_fit_makes_auto_take_jax_with_the_reason(monkeypatch):
    experiment = _auto(heads=(1, 2))
    assert experiment.plan("gpu").attention.implementation == "pallas"  # the GPU's kernel fits any T
    seen = []
    monkeypatch.setitem(attention.KERNEL_FITS, "gpu", lambda shapes: seen.append(shapes.seq_len) or "needs 2 MiB")
    plan = experiment.plan("gpu")
    assert seen == [8] and plan.attention.implementation == "jax" and plan.core == "jax"
    assert plan.attention.reason == "auto on gpu: JAX (the Pallas kernel does not fit: needs 2 MiB)"
    assert plan.results_fields() == {"attention": "jax", "attention_fallback": "needs 2 MiB"}
    assert {p.recipe.model.attention for p in plan.programs} == {"jax"}  # the programs compute what it says
    asked = make_experiment(set_field(tiny_sequence_config(heads=(1, 2)), "attention", "pallas"))
    assert asked.plan("gpu").attention.implementation == "pallas"  # asked for by name: not auto's to change


def test_a_plan_without_its_kernel_keeps_every_program_and_member():
    plan = _auto(heads=(1, 2), seed=(0, 1)).plan("gpu", 1)
    fallen = plan.without_kernel("RuntimeError: no lowering")
    assert fallen.attention.implementation == "jax" and "no lowering" in fallen.attention.fallback
    assert [(p.name, p.members) for p in fallen.programs] == [(p.name, p.members) for p in plan.programs]
    assert fallen.without_kernel("again") is None  # JAX has no kernel to drop: the failure stands


def test_an_experiment_without_shapes_is_laid_out_as_asked_and_counted_by_members():
    experiment = make_experiment(tiny_mixture_config())
    plan = experiment.plan("cpu")
    [program] = plan.programs
    assert plan.shapes is None and plan.strategy is None and plan.attention is None
    assert program.members == list(range(len(experiment.members)))
    assert plan.step_seconds(program) == len(experiment.members)
    assert plan.estimate("compiled_bytes_per_member_step") is None and plan.results_fields() == {}
