"""The mixture's per-step trace (W/trace, io/trace.py; ``run.trace``): what it keeps, that its
values are the step's own, that it changes nothing of training, and that TensorBoard's train/loss
holds the same steps."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mhjax
from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.io import trace
from mhjax.io.workdir import Workdir
from mhjax.models.classifier import classifier_apply
from mhjax.train.loop import Sweep, run
from tests.test_mixture_sweep import tiny_mixture_config

STEPS = 20
FIELDS = ["grad_norm_over_loss", "loss", "margin", "param_norm"]


def traced_config(**train):
    config = tiny_mixture_config(heads=(1, 4), num_train=(8,))
    config.init.scheme = "random_decoders"
    with config.train.unlocked():
        config.train.update(dict(steps=STEPS, chunk_steps=6, eval_every=0, checkpoint_every=STEPS, **train))
    return config


def test_kept_steps_are_every_step_to_ten_thousand_then_about_a_thousand_per_decade():
    steps = np.arange(0, 100_001)
    kept = trace.kept(steps)
    assert kept[:10_001].all() and not kept[10_001]
    assert 990 <= kept[10_001:].sum() <= 1010  # log-spaced: ~1000 in the decade 10^4..10^5
    gaps = np.diff(steps[kept][steps[kept] > 10_000])
    assert gaps[0] < gaps[-1] and gaps.max() <= 231  # growing with the step, 0.23% apart
    # a chunk's rows do not depend on how the steps were cut into chunks
    cut = np.concatenate([start + trace.kept_rows(start, 7_000) for start in range(0, 98_000, 7_000)])
    assert np.array_equal(cut, steps[kept][steps[kept] < 98_000])


def test_the_writer_continues_from_the_resumed_step_without_duplicates_and_drops_a_partial_record(tmp_path):
    folder = str(tmp_path / "trace")
    rows = lambda start, n: {"loss": np.arange(start, start + n, dtype=np.float32)[:, None] * [1, -1]}  # noqa: E731
    writer = trace.TraceWriter(folder, 0)
    for start in (0, 5, 10):  # three chunks of 5; then a kill in the middle of a write
        writer.append(["a", "b"], rows(start, 5), start)
    with open(os.path.join(folder, "a.bin"), "ab") as f:
        f.write(b"\x01\x02\x03")
    assert list(trace.read(folder, "a")["step"]) == list(range(15))  # the partial record is left out
    resumed = trace.TraceWriter(folder, 10)  # a checkpoint at step 10: rows 10-14 are trained again
    resumed.append(["a", "b"], rows(10, 8), 10)
    a, b = trace.read(folder, "a"), trace.read(folder, "b")
    assert list(a["step"]) == list(range(18)) and list(b["step"]) == list(range(18))
    assert np.array_equal(a["loss"], np.arange(18)) and np.array_equal(b["loss"], -np.arange(18))
    trace.TraceWriter(folder, 18).append(["a"], rows(18, 2), 18)  # trained longer: continues
    assert list(trace.read(folder, "a")["step"]) == list(range(20))
    a = trace.read(folder, "a")  # run.trace(m): keys and attributes alike
    assert a.step is a["step"] and a.loss is a["loss"] and {"step", "loss"} <= set(dir(a))
    with pytest.raises(AttributeError, match="'margin'"):
        getattr(a, "margin")  # noqa: B009 -- the attribute access is the test
    writer.append(["c"], None, 0)  # nothing traced: nothing written
    with pytest.raises(ConfigError, match="trace: no per-step trace of 'c'"):
        trace.read(folder, "c")


def test_the_trace_changes_nothing_of_training():
    """The same members with and without the trace: bit-for-bit the same parameters and losses."""
    out = {}
    for traced in (True, False):
        config = traced_config(trace=traced)
        sweep = Sweep(make_experiment(config))
        states = sweep.init_states()
        program = sweep.programs[0]
        states[program.name], metrics = sweep.run_chunk(program, states[program.name], STEPS)
        assert ("trace" in metrics) == traced
        out[traced] = sweep.host((states[program.name].params, metrics["loss"]))
    for a, b in zip(jax.tree_util.tree_leaves(out[True]), jax.tree_util.tree_leaves(out[False])):
        assert np.array_equal(a, b)


def by_hand(theta, X, y, heads):
    """[||grad L|| / L, L, min_i y_i Phi_i / ||theta||, ||theta||] of an unpadded member."""
    mask = np.ones(heads, np.float32)
    loss, grads = jax.value_and_grad(lambda p: jnp.mean(jax.nn.softplus(-y * classifier_apply(p, X, mask, heads))))(
        theta
    )
    norm = lambda t: np.sqrt(sum(np.sum(np.square(x)) for x in jax.tree_util.tree_leaves(t)))  # noqa: E731
    margin = np.min(y * classifier_apply(theta, X, mask, heads)) / norm(theta)
    return [norm(grads) / loss, loss, margin, norm(theta)]


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    workdir = str(tmp_path_factory.mktemp("traced"))
    experiment = make_experiment(traced_config())
    run(experiment, workdir, progress=False, log=lambda m: None)
    return experiment, workdir


def test_run_trace_holds_every_step_with_the_steps_own_values(traced_run):
    experiment, workdir = traced_run
    loaded = mhjax.load(workdir)
    for member in experiment.members:
        got = loaded.trace(member.name)
        assert list(got) == ["step", *FIELDS] and list(got["step"]) == list(range(STEPS))
        # L(theta_s) at step s: the exact loss_curve's points
        record = next(r for r in loaded.results if r["name"] == member.name)
        curve = dict(zip(record["loss_curve"]["steps"], record["loss_curve"]["values"]))
        assert np.allclose([got["loss"][k] for k in curve if k < STEPS], [v for k, v in curve.items() if k < STEPS])
        assert got["loss"][-1] < got["loss"][0] and np.all(np.isfinite([got[f] for f in FIELDS]))
        # step 0 by hand from theta_0 and the data, with none of the recipe's code
        X, y = experiment.train_data(member["seed"])
        n = member["num_train"]
        want = by_hand(loaded.theta0(member.name), X[:n], y[:n], member["heads"])
        np.testing.assert_allclose([got[f][0] for f in FIELDS], want, rtol=2e-5, err_msg=member.name)


def test_tensorboard_train_loss_holds_every_traced_step(traced_run):
    experiment, workdir = traced_run
    for member in experiment.members:
        steps, losses = Workdir(workdir).curves(member.name)["train/loss"]
        got = trace.read(Workdir(workdir).trace_dir, member.name)
        assert np.array_equal(steps, got["step"]) and np.allclose(losses, got["loss"], rtol=1e-6)


# ~11 s: the thinning rule is unit-tested
@pytest.mark.slow
def test_past_ten_thousand_steps_the_trace_and_tensorboard_keep_log_spaced_steps(tmp_path):
    config = traced_config()
    config.sweep.heads = (2,)
    with config.train.unlocked():
        config.train.update(dict(steps=10_500, chunk_steps=3_500, checkpoint_every=10_500, loss_points=0))
    workdir = str(tmp_path / "w")
    run(make_experiment(config), workdir, progress=False, log=lambda m: None)
    got = mhjax.load(workdir).trace("h2-s0")
    want = np.arange(10_500)[trace.kept(np.arange(10_500))]
    assert np.array_equal(got["step"], want) and want.size == 10_001 + 21  # 1000 log10(1.05) = 21.2
    steps, losses = Workdir(workdir).curves("h2-s0")["train/loss"]
    assert np.array_equal(steps, want) and np.allclose(losses, got["loss"], rtol=1e-6)
