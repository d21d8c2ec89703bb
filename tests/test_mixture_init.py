"""theta_0 schemes of the mixture experiment: the degenerate zero_plus_step is a one-head model
with rescaled step sizes (checked against a hand-written one-head GD), the default
random_decoders gives heads that differ and stay different, and a member's numbers do not
depend on the sweep around it."""

import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.experiments.mixture_results import head_spread, loss_slope
from mhjax.models.classifier import classifier_apply, init_params
from mhjax.train.loop import Sweep
from tests.conftest import set_field
from tests.test_mixture_sweep import tiny_mixture_config

K = 20


def trained(config, steps=K):
    """(experiment, sweep, theta_0 states, theta_K member params, per-step losses (K, members))."""
    experiment = make_experiment(config)
    sweep = Sweep(experiment)
    program = sweep.programs[0]
    states = sweep.init_states()
    theta0 = sweep.member_states(states)
    states[program.name], metrics = sweep.run_chunk(program, states[program.name], steps)
    final = sweep.member_states(states)
    return experiment, sweep, theta0, final, np.asarray(metrics["loss"])


def one_head_reference(X, y, eta, heads, steps):
    """Plain GD on a ONE-head model Phi = <U', softmax(X W X^T) X> (no classifier code): theta_0
    = one step of size eta on U' from zero, then steps eta on U' and eta / heads on W.
    Returns (losses of theta_0..theta_{K-1}, Phi(theta_K; X))."""
    d, t = X.shape[2], X.shape[1]

    def phi(W, U, X):
        attn = jax.nn.softmax(jnp.einsum("ntd,de,nse->nts", X, W, X), axis=-1)
        return jnp.einsum("td,ntd->n", U, jnp.einsum("nts,nsd->ntd", attn, X))

    loss = lambda W, U: jnp.mean(jax.nn.softplus(-y * phi(W, U, X)))
    W, U = jnp.zeros((d, d)), jnp.zeros((t, d))
    U = U - eta * jax.grad(loss, 1)(W, U)
    losses = []
    for _ in range(steps):
        value, (gW, gU) = jax.value_and_grad(loss, (0, 1))(W, U)
        losses.append(float(value))
        W, U = W - (eta / heads) * gW, U - eta * gU
    return np.array(losses), np.asarray(phi(W, U, X))


def test_zero_plus_step_is_a_one_head_model_with_rescaled_steps():
    config = tiny_mixture_config(heads=(1, 4), num_train=(16,), step_size=(0.5,))
    config.init.scheme = "zero_plus_step"
    experiment, sweep, _, final, losses = trained(config)
    X, y = (jnp.asarray(a) for a in experiment.train_data(0))
    for j, member in enumerate(experiment.members):
        h = member["heads"]
        ref_losses, ref_phi = one_head_reference(X, y, 0.5, h, K)
        np.testing.assert_allclose(losses[:, j], ref_losses, rtol=1e-5, atol=1e-6, err_msg=member.name)
        params = final[member.name].params
        phi = classifier_apply(params, X, (np.arange(4) < h).astype(np.float32), h)
        np.testing.assert_allclose(np.asarray(phi), ref_phi, rtol=1e-5, atol=1e-5, err_msg=member.name)
        assert float(head_spread(params, jnp.asarray(np.arange(4) < h))) == 0.0  # identical heads
    # The two members differ only through the W step eta/H: a learning-rate effect.
    assert not np.allclose(losses[:, 0], losses[:, 1])


def test_default_heads_differ_at_theta0_and_thetaK_and_a_member_equals_itself_alone():
    config = tiny_mixture_config(heads=(1, 2, 4), num_train=(16,))
    assert config.init.scheme == "zero_plus_step"  # the tiny config pins the old scheme; switch to the default
    config.init.scheme, config.init.tau = "random_decoders", 1.0
    experiment, _, theta0, final, _ = trained(config)
    for member in experiment.members:
        mask = jnp.asarray(np.arange(4) < member["heads"], jnp.float32)
        for state in (theta0, final):
            spread = float(head_spread(state[member.name].params, mask))
            assert (spread > 0.1) if member["heads"] >= 2 else spread == 0.0, member.name
        assert not np.any(np.asarray(theta0[member.name].params["W"]))  # W = 0 at theta_0
    config.sweep.heads = (4,)
    alone_exp, _, _, alone, _ = trained(config)
    for key in ("W", "U"):
        np.testing.assert_allclose(
            np.asarray(alone[alone_exp.members[0].name].params[key]),
            np.asarray(final["h4-s0"].params[key]),
            rtol=1e-5,
            atol=1e-6,
            err_msg=key,
        )


class Shape:
    dim, seq_len = 3, 4


@pytest.mark.parametrize("heads", [1, 2, 3, 4, 5])
def test_antisymmetric_pairs_give_zero_output(heads):
    mask = (np.arange(6) < heads).astype(np.float32)
    params = init_params(jax.random.PRNGKey(0), Shape, 6, "antisymmetric", 1.0, head_mask=mask)
    X = jax.random.normal(jax.random.PRNGKey(1), (5, 4, 3))
    np.testing.assert_allclose(np.asarray(classifier_apply(params, X, mask, heads)), 0.0, atol=1e-6)
    U = np.asarray(params["U"])
    live = heads - heads % 2  # an odd H's last head has no partner and is zero
    assert np.all(U[live:] == 0)
    for pair in range(0, live, 2):
        np.testing.assert_array_equal(U[pair + 1], -U[pair])
        assert np.abs(U[pair]).max() > 0


def test_per_head_draws_do_not_depend_on_max_heads():
    small = init_params(jax.random.PRNGKey(3), Shape, 2, "random_decoders", 0.5)
    large = init_params(jax.random.PRNGKey(3), Shape, 8, "random_decoders", 0.5)
    np.testing.assert_array_equal(np.asarray(large["U"])[:2], np.asarray(small["U"]))
    assert np.std(np.asarray(large["U"])) == pytest.approx(0.5, rel=0.3)


def test_loss_slope_of_an_exact_power_law():
    steps = np.unique(np.round(np.geomspace(1, 1000, 40)))
    assert loss_slope(steps, 3.0 / steps, 1000) == pytest.approx(-1.0, abs=1e-9)
    assert math.isnan(loss_slope([1, 2], [1.0, 0.5], 1000))  # no point in the last decade


@pytest.mark.parametrize(
    "field, value, needle",
    [
        ("init.tau", -1.0, "config.init.tau"),
        ("init.scheme", "xavier", "config.init.scheme"),
        ("train.steps", 0, "config.train.steps"),
        ("train.loss_points", -3, "config.train.loss_points"),
        ("data.noise_std", -1.0, "config.data.noise_std"),
        ("data.seq_len", 0, "config.data.seq_len"),
    ],
)
def test_bad_init_and_train_fields(field, value, needle):
    config = set_field(tiny_mixture_config(), field, value)
    with pytest.raises(ConfigError) as info:
        make_experiment(config)
    assert str(info.value).startswith(needle) and "\n" not in str(info.value), str(info.value)


def test_run_records_rates_spread_and_path(tmp_path):
    """Default theta_0 through the host loop: head_spread > 0 for H >= 2 (0 for H = 1), the exact
    loss curve at the log-spaced steps equals the program's per-step losses, loss_slope is its
    last-decade fit, margin_loss_product = gamma^2 eta K L(theta_K), and evaluations at k = 0."""
    from mhjax.io.workdir import Workdir
    from mhjax.train.loop import run

    config = tiny_mixture_config(heads=(1, 3), num_train=(16,))
    config.init.scheme = "random_decoders"
    config.train.eval_points = 4
    payload = run(make_experiment(config), str(tmp_path), progress=False, log=lambda m: None)
    _, _, _, _, losses = trained(config)
    for j, m in enumerate(payload["members"]):
        assert (m["head_spread"] > 0.1) if m["heads"] >= 2 else m["head_spread"] == 0.0, m["name"]
        steps, values = m["loss_curve"]["steps"], m["loss_curve"]["values"]
        assert steps[0] == 0 and steps[-1] == K and len(steps) >= 6
        np.testing.assert_allclose(values[:-1], losses[steps[:-1], j], rtol=1e-6)
        assert values[-1] == pytest.approx(m["train_loss_eval"], rel=1e-5)
        assert m["loss_slope"] == pytest.approx(loss_slope(steps, values, K), rel=1e-9) and m["loss_slope"] < 0
        product = m["ntk_margin"] ** 2 * m["step_size"] * K * values[-1]
        assert m["margin_loss_product"] == pytest.approx(product, rel=1e-5)
        tag = "eval/distance_from_init"
        curve = Workdir(tmp_path).curves(m["name"])[tag]
        assert curve[0][0] == 0 and curve[1][0] == 0.0 and curve[1][-1] == pytest.approx(m["param_distance"], rel=1e-4)
    assert os.path.getsize(os.path.join(str(tmp_path), "path.png")) > 0


def test_own_steps_freeze_a_member_at_its_k():
    """steps_per_example = 0.5: the n=8 member takes 4 steps and then stands still, equal to the
    same member trained for 4 steps alone; a product above train.steps is a config error."""
    config = tiny_mixture_config(heads=(2,), num_train=(8, 16))
    config.train.steps_per_example = 0.5
    experiment, _, _, final, _ = trained(config, steps=12)
    config.train.steps_per_example = 0.0
    config.sweep.num_train = (8,)
    _, _, _, alone, _ = trained(config, steps=4)
    small = next(m.name for m in experiment.members if m["num_train"] == 8)
    for key in ("W", "U"):
        expected = np.asarray(next(iter(alone.values())).params[key])
        np.testing.assert_allclose(np.asarray(final[small].params[key]), expected, rtol=1e-6, atol=1e-7)
    config.train.steps_per_example = 3.0
    with pytest.raises(ConfigError, match=r"^config\.train\.steps_per_example: .* exceeds train\.steps"):
        make_experiment(config)


def test_lanczos_64_steps_match_the_dense_hessian():
    """The recipe's hessian_min / hessian_max (64 Lanczos steps on the padded parameters) equal
    the extreme eigenvalues of jax.hessian of the member's loss on the raveled parameters."""
    from jax.flatten_util import ravel_pytree

    config = tiny_mixture_config(heads=(2,), num_train=(8,))
    config.init.scheme = "random_decoders"
    config.data.dim, config.data.seq_len = 6, 2
    config.data.relevant_fraction = 0.5
    config.analysis.lanczos_iters = 64
    experiment = make_experiment(config)
    recipe = experiment.programs("auto", "cpu")[0].recipe
    consts = jax.tree_util.tree_map(jnp.asarray, experiment.member_constants(experiment.members[0]))
    params = recipe.init_params(consts)
    params = jax.tree_util.tree_map(lambda p: p + 0.3 * jax.random.normal(jax.random.PRNGKey(5), p.shape), params)
    flat, unravel = ravel_pytree(params)
    assert flat.size == 2 * (36 + 12)  # 96 parameters: 64 Lanczos steps span most of the space
    dense = np.asarray(jax.jit(jax.hessian(lambda z: recipe.train_loss(unravel(z), consts)))(flat), np.float64)
    eigs = np.linalg.eigvalsh((dense + dense.T) / 2)
    out = jax.jit(recipe.evaluate)(params, consts, 0)
    scale = np.abs(eigs).max()
    assert float(out["hessian_max"]) == pytest.approx(eigs[-1], abs=1e-3 * scale)
    assert float(out["hessian_min"]) == pytest.approx(eigs[0], abs=1e-3 * scale)
    assert float(out["step_times_hessian_max"]) == pytest.approx(float(consts.step_size) * float(out["hessian_max"]))


@pytest.mark.parametrize(
    "override, needle",
    [
        ("--config.init.tau=-1", "config.init.tau"),
        ("--config.init.scheme=xavier", "config.init.scheme"),
        ("--config.train.steps_per_example=10.0", "config.train.steps_per_example"),
    ],
)
def test_cli_rejects_bad_mixture_values_with_status_2(tmp_path, capsys, override, needle):
    from mhjax import cli

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    config = os.path.join(root, "configs", "mixture.py")
    code = cli.main(["train", "--config", config, "--workdir", str(tmp_path / "w"), "--no-progress", override])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith(f"mhjax: error: {needle}:"), err
