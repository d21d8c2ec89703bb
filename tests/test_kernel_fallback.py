"""attention=auto on a GPU falls back to the JAX path when the Pallas kernel fails to compile
(train/ahead.compile_sweep, mhjax.plan's Plan.without_kernel): one line, recorded in results.json's
fields, and the sweep trains what attention=jax trains. The failure is injected into the
kernel's lowering; the sweep is planned for "gpu" (what auto picks there) on this CPU."""

import numpy as np
import pytest

from mhjax.experiments import make_experiment
from mhjax.models import pallas_attention, pallas_block
from mhjax.train import ahead
from mhjax.train.loop import Sweep
from tests.conftest import set_field, tiny_sequence_config


def _broken(*args, **kwargs):
    raise RuntimeError("injected: Triton could not lower the kernel\nsecond line")


def _config(attention):
    return set_field(set_field(tiny_sequence_config(), "strategy", "one_program"), "attention", attention)


def _losses(sweep):
    """{program: (steps, members) training losses of the first chunk}."""
    states = sweep.init_states()
    return {p.name: np.asarray(sweep.run_chunk(p, states[p.name], 3)[1]["loss"]) for p in sweep.programs}


# where the failure is injected: the attention kernel, or the block's norm/MLP kernels
BROKEN = [(pallas_attention, "check_lowering"), (pallas_block, "_check")]


@pytest.mark.parametrize("module,field", BROKEN, ids=["attention", "block"])
def test_auto_falls_back_to_jax_with_one_line_and_trains_what_jax_trains(monkeypatch, module, field):
    experiment = make_experiment(_config("auto"))
    assert experiment.plan("gpu").attention.implementation == "pallas"
    sweep = Sweep(experiment, backend="gpu")
    monkeypatch.setattr(module, field, _broken)
    lines = []
    ahead.compile_sweep(sweep, [3], init=True, log=lines.append)
    assert lines == [
        "attention: the Pallas kernel failed to compile (RuntimeError: injected: Triton could not lower the "
        "kernel); attention=auto falls back to JAX"
    ]
    fields = sweep.plan.results_fields()
    assert fields["attention"] == "jax" and "injected: Triton" in fields["attention_fallback"]
    assert sweep.plan.attention.reason == "auto on gpu: JAX (the Pallas kernel failed to compile)"
    reference = Sweep(make_experiment(_config("jax")), backend="gpu")
    ours, theirs = _losses(sweep), _losses(reference)
    assert ours.keys() == theirs.keys() == {"all"} and ours["all"].shape == (3, 2)
    np.testing.assert_array_equal(ours["all"], theirs["all"])


def test_a_kernel_asked_for_fails_as_it_is(monkeypatch):
    """attention=pallas is the user's choice: its failure is not hidden."""
    sweep = Sweep(make_experiment(_config("pallas")), backend="gpu")
    monkeypatch.setattr(pallas_attention, "check_lowering", _broken)
    with pytest.raises(RuntimeError, match="injected"):
        ahead.compile_sweep(sweep, [3], init=True, log=print)
