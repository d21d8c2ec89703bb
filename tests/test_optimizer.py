"""The language-model optimizer (experiments/optimizer.py) against optax's own schedule and
AdamW, per member under vmap, and through a sweep: learning rate logged, results recorded,
train-longer refused for a schedule that ends at train.steps."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from mhjax.config import ConfigError
from mhjax.experiments import make_experiment, optimizer
from mhjax.workflows.train import train
from tests.conftest import tiny_sequence_config

STEPS = 20
LM = optimizer.Settings("warmup_cosine", 5, 1e-4, 0.1, 0.5, STEPS)


def _params(key):
    a, b = jax.random.split(key)
    return {"dense": {"kernel": jax.random.normal(a, (4, 3)), "bias": jax.random.normal(b, (3,))}, "scale": jnp.ones(3)}


def _run(tx, params, grads):
    state = tx.init(params)
    for g in grads:
        updates, state = tx.update(g, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def _grads(n=STEPS):
    return [jax.tree_util.tree_map(lambda x: 3.0 * x, _params(jax.random.key(100 + i))) for i in range(n)]


def test_the_schedule_is_optax_warmup_cosine_at_each_learning_rate():
    counts = jnp.arange(STEPS + 3)
    for lr in (3e-3, 1e-3):
        want = optax.warmup_cosine_decay_schedule(0.0, lr, 5, STEPS, end_value=1e-4)(counts)
        got = jax.vmap(lambda c, lr=lr: optimizer.schedule(LM, jnp.float32(lr))(c))(counts)
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-12)
    assert optimizer.schedule(optimizer.Settings(), 0.5) == 0.5


def test_the_optimizer_is_clipped_adamw_with_decay_on_matrices_only():
    lr = 3e-3
    reference = optax.chain(
        optax.clip_by_global_norm(0.5),
        optax.adamw(
            optax.warmup_cosine_decay_schedule(0.0, lr, 5, STEPS, end_value=1e-4),
            weight_decay=0.1,
            mask=lambda p: jax.tree_util.tree_map(lambda x: x.ndim >= 2, p),
        ),
    )
    params, grads = _params(jax.random.key(0)), _grads()
    want, _ = _run(reference, params, grads)
    got, state = _run(optimizer.make(LM, lr), params, grads)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    want_lr = optax.warmup_cosine_decay_schedule(0.0, lr, 5, STEPS, end_value=1e-4)(STEPS - 1)
    assert float(state.hyperparams["learning_rate"]) == pytest.approx(float(want_lr), rel=1e-5)
    # decay reaches the kernel, not the bias: with zero gradients only the decay moves a weight
    zero = [jax.tree_util.tree_map(jnp.zeros_like, params)] * 3
    moved, _ = _run(optimizer.make(optimizer.Settings("constant", 0, 0.0, 0.5, None, STEPS), 1e-2), params, zero)
    assert not np.allclose(moved["dense"]["kernel"], params["dense"]["kernel"])
    np.testing.assert_array_equal(moved["dense"]["bias"], params["dense"]["bias"])
    np.testing.assert_array_equal(moved["scale"], params["scale"])


def test_each_member_runs_its_own_learning_rate_under_vmap():
    rates = jnp.array([1e-3, 3e-3], jnp.float32)
    params, grads = _params(jax.random.key(1)), _grads(6)

    def member(lr):
        return _run(optimizer.make(LM, lr), params, grads)[0]

    together = jax.vmap(member)(rates)
    for i, lr in enumerate((1e-3, 3e-3)):
        alone = member(jnp.float32(lr))
        for a, b in zip(jax.tree_util.tree_leaves(together), jax.tree_util.tree_leaves(alone), strict=True):
            np.testing.assert_allclose(a[i], b, rtol=1e-6, atol=1e-8)


def test_the_default_is_the_papers_adam():
    state = optimizer.make(optimizer.Settings(), 1e-3).init(_params(jax.random.key(2)))
    reference = optax.inject_hyperparams(optax.adam)(learning_rate=1e-3).init(_params(jax.random.key(2)))
    assert jax.tree_util.tree_structure(state) == jax.tree_util.tree_structure(reference)


def test_a_sweep_with_the_lm_optimizer_logs_its_schedule_and_refuses_to_train_longer(tmp_path):
    config = tiny_sequence_config(heads=(1, 2))
    config.train.update(dict(schedule="warmup_cosine", warmup_steps=2, min_learning_rate=1e-4))
    config.train.weight_decay, config.train.clip_norm = 0.1, 1.0
    workdir = str(tmp_path / "w")
    payload = train(make_experiment(config), workdir, progress=False, log=lambda m: None)
    assert payload["optimizer"] == {
        "name": "adamw",
        "schedule": "warmup_cosine",
        "warmup_steps": 2,
        "min_learning_rate": 1e-4,
        "weight_decay": 0.1,
        "clip_norm": 1.0,
    }
    run = __import__("mhjax").load(workdir)
    steps, rates = run.curves("copy-h1-s0")["train/learning_rate"]
    # every step k, computed on the host: the rate of the step from theta_k to theta_{k+1}
    assert list(steps) == list(range(6))
    want = optax.warmup_cosine_decay_schedule(0.0, 3e-3, 2, 6, end_value=1e-4)(np.arange(6))
    np.testing.assert_allclose(rates, want, rtol=1e-6)
    assert all(m["status"] == "ok" for m in payload["members"])
    config.train.steps = 9
    with pytest.raises(ConfigError, match="holds a run of 6 steps: train.schedule 'warmup_cosine' decays"):
        train(make_experiment(config), workdir, progress=False, log=lambda m: None)


@pytest.mark.parametrize("written", ["None", "none", "null", "NULL", ""])
def test_clip_norm_takes_none_where_the_config_file_set_a_number(written):
    # configs/text.py sets clip_norm = 1.0; its default is None, so None (in any spelling) is allowed
    from mhjax.config import apply_overrides, load_config_file
    from mhjax.experiments import override_defaults
    from mhjax.workflows.configs import config_path

    config = load_config_file(config_path("text"))
    assert config.train.clip_norm == 1.0
    cleared = apply_overrides(config, {"train.clip_norm": written}, override_defaults(config))
    assert cleared.train.clip_norm is None and optimizer.Settings.from_config(cleared).clip_norm is None
    with pytest.raises(ConfigError, match=r"config.train.clip_norm: expected a number, got 'x'"):
        apply_overrides(config, {"train.clip_norm": "x"}, override_defaults(config))  # a typo stays refused


def test_load_config_takes_python_none_for_a_field_whose_default_is_none(tmp_path):
    import mhjax

    corpus = tmp_path / "c.txt"
    corpus.write_bytes(bytes(range(256)) * 32)  # held-out 819 bytes: validation and test windows of T + 1
    overrides = {"data.path": str(corpus), "train.clip_norm": None, "train.snapshot_steps": None}
    config = mhjax.load_config("text", overrides)
    assert config.train.clip_norm is None and config.train.snapshot_steps is None
    with pytest.raises(ConfigError, match=r"config.train.steps: expected an integer"):
        mhjax.load_config("text", {"data.path": str(corpus), "train.steps": None})  # its default is not None


def test_a_decay_horizon_apart_from_the_steps_lets_a_warmup_cosine_run_train_longer(tmp_path):
    """train.decay_steps (nanoGPT's lr_decay_iters): the cosine ends there, whatever train.steps
    is, so a 6-step run trains on to 9 on the schedule of a 9-step run from the start (before: refused,
    "use a new workdir"); a resumed run's numbers are the straight run's (test_chaos, test_resume_records)."""
    import mhjax

    def config(steps):
        c = tiny_sequence_config(heads=(1, 2))
        c.train.update(dict(schedule="warmup_cosine", warmup_steps=2, min_learning_rate=1e-4, decay_steps=9))
        c.train.steps = steps
        return c

    short = train(make_experiment(config(6)), str(tmp_path / "w"), progress=False, log=lambda m: None)
    assert short["optimizer"]["decay_steps"] == 9
    longer = train(make_experiment(config(9)), str(tmp_path / "w"), progress=False, log=lambda m: None)
    assert longer["steps"] == 9 and all(m["status"] == "ok" for m in longer["members"])
    steps, rates = mhjax.load(tmp_path / "w").curves("copy-h1-s0")["train/learning_rate"]
    want = optax.warmup_cosine_decay_schedule(0.0, 3e-3, 2, 9, end_value=1e-4)(np.arange(9))
    assert list(steps) == list(range(9))
    np.testing.assert_allclose(rates, want, rtol=1e-6)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(schedule="warmup_cosine", decay_steps=0), r"^config.train.decay_steps: must be None or an integer >= 1"),
        (dict(schedule="warmup_cosine", warmup_steps=4, decay_steps=4), r"\[0, train.decay_steps = 4\); got 4$"),
        (dict(decay_steps=10), r"^config.train.decay_steps: applies to train.schedule 'warmup_cosine' only"),
    ],
)
def test_decay_steps_is_checked_in_one_line(fields, message):
    config = tiny_sequence_config(heads=(1,))
    config.train.update(fields)
    with pytest.raises(ConfigError, match=message):
        optimizer.validate(config)
