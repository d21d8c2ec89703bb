"""The sweep engine: member independence, strategies, divergence, resume and outputs."""

import json
import os

import jax
import numpy as np
import pytest

from mhjax.experiments import make_experiment
from mhjax.plan import pricing
from mhjax.train.engine import unstack
from mhjax.train.loop import Sweep, run
from tests.conftest import tiny_sequence_config


def member_params(sweep, states, name):
    """A member's params sliced from its program's stacked state."""
    index = next(i for i, m in enumerate(sweep.experiment.members) if m.name == name)
    return unstack(sweep.programs, {program: state.params for program, state in states.items()})[index]


def train(config, steps=4, chunk=2):
    sweep = Sweep(make_experiment(config), backend="cpu")
    return sweep, sweep.train(sweep.init_states(), steps, chunk)


def assert_trees_close(a, b, tol=1e-5):
    """fp32 agreement of every parameter but the attention key biases: softmax is invariant
    to them, so their gradient is exactly zero in exact arithmetic and ~1e-10 round-off in
    fp32, which Adam (eps 1e-8) amplifies into O(lr) steps. They never change the output."""
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree_util.tree_leaves(b)):
        if "'key']['bias'" in jax.tree_util.keystr(path):
            continue
        np.testing.assert_allclose(x, y, rtol=tol, atol=tol, err_msg=jax.tree_util.keystr(path))


def test_members_are_the_cartesian_product_with_stable_names():
    config = tiny_sequence_config(task=("copy", "cycle"), heads=(1, 2, 4), seed=(0, 1))
    names = [m.name for m in make_experiment(config).members]
    assert len(names) == 12 and names[0] == "copy-h1-s0" and "cycle-h4-s1" in names


# grouped (slow, ~26 s) is every other test's strategy.
STRATEGIES = ("grouped", "fused", "unrolled", "one_program")


# unrolled compiles one model per member (8 here, minutes on 2 cores): slow; the fast
# test_one_program_and_grouped_programs_train_identically[unrolled] checks its members.
@pytest.mark.parametrize(
    "strategy", [pytest.param(s, marks=pytest.mark.slow) if s in ("grouped", "unrolled") else s for s in STRATEGIES]
)
def test_member_alone_equals_member_in_sweep(strategy):
    """What docs/sweeps.md says a member equals in another sweep (another program; fused: its head
    count traced, padded to 4 heads): its keys, theta_0, training and held-out batches bit for bit
    (dropout masks derive from the key), its step-0 loss to round-off, its parameters after 4
    steps to float32 round-off but the attention key biases (gradient 0 in exact arithmetic: Adam
    scales its round-off to ~lr a step, and no output depends on them), to 2 x lr a step."""
    from mhjax.data import sequences

    # the member (2 heads) shares its program with 3 others (grouped) or 7 (fused pads it to 4 heads)
    big = tiny_sequence_config(task=("copy", "cycle"), heads=(2,) if strategy == "grouped" else (2, 4), seed=(0, 1))
    big.strategy = strategy
    alone = tiny_sequence_config(task=("cycle",), heads=(2,), seed=(1,))
    name, steps, lr = "cycle-h2-s1", 4, 3e-3
    trained = [train(big), train(alone)]
    assert_trees_close(member_params(*trained[0], name), member_params(*trained[1], name))
    if strategy != "fused":  # the rest once: fused is the program farthest from the member's own
        return
    draws = []
    for sweep, _ in trained:
        index, recipe = member_recipe(sweep, name)
        consts = sweep.experiment.member_constants(sweep.experiment.members[index])
        batches = [tuple(recipe._batch(consts, s)) for s in range(steps)]
        heldout = tuple(sequences.eval_batch(consts.eval_key, consts.task_id, 8, 8, 16, recipe.tasks))
        start = sweep.member_states(sweep.init_states())[name].params
        draws.append((consts.key, consts.data_key, consts.eval_key, batches, heldout, start))
    for x, y in zip(*(jax.tree_util.tree_leaves(d) for d in draws), strict=True):
        assert np.array_equal(x, y)
    final = [sweep.member_states(states)[name] for sweep, states in trained]
    assert final[0].initial_loss == pytest.approx(final[1].initial_loss, rel=1e-6)
    assert_trees_close(final[0].params, final[1].params, tol=1e-6)  # every parameter but the key biases
    biases = [
        np.abs(x - y).max()
        for (path, x), y in zip(
            jax.tree_util.tree_leaves_with_path(final[0].params), jax.tree_util.tree_leaves(final[1].params)
        )
        if "'key']['bias'" in jax.tree_util.keystr(path)
    ]
    assert biases and max(biases) <= 2 * lr * steps


def member_recipe(sweep, name):
    """(member index, the recipe its program trains it with) in ``sweep``."""
    from mhjax.train.engine import recipe_groups

    index = next(i for i, m in enumerate(sweep.experiment.members) if m.name == name)
    program = next(p for p in sweep.programs if index in p.members)
    position, start = program.members.index(index), 0
    for size, recipe in recipe_groups(program):
        if start <= position < start + size:
            return index, recipe
        start += size
    raise AssertionError(name)


# fused (slow, ~32 s): test_member_alone_equals_member_in_sweep[fused] checks its members
@pytest.mark.parametrize("strategy", [pytest.param("fused", marks=pytest.mark.slow), "unrolled"])
def test_one_program_and_grouped_programs_train_identically(strategy):
    grouped, single = tiny_sequence_config(heads=(1, 2, 4)), tiny_sequence_config(heads=(1, 2, 4))
    single.strategy = strategy
    sg, tg = train(grouped)
    sf, tf = train(single)
    assert [p.name for p in sf.programs] == ["all"] and len(sg.programs) == 3
    for m in sg.experiment.members:
        assert_trees_close(member_params(sg, tg, m.name), member_params(sf, tf, m.name))
    # Evaluation goes through the same per-member recipes.
    eval_grouped, eval_single = sg.evaluate(tg), sf.evaluate(tf)
    assert sorted(eval_grouped) == sorted(eval_single) == [0, 1, 2]
    for i in eval_grouped:
        assert eval_grouped[i] == pytest.approx(eval_single[i], rel=1e-4), i


# the plain JAX path's layout is also checked by the fast test_one_program_diverging_member_leaves_the_others_exact
# auto (slow too, ~21 s): test_member_alone_equals_member_in_sweep[one_program] trains the layout
@pytest.mark.parametrize(
    "implementation", [pytest.param("auto", marks=pytest.mark.slow), pytest.param("jax", marks=pytest.mark.slow)]
)
def test_one_program_groups_members_by_head_count_and_trains_like_grouped(tmp_path, implementation):
    """On both attention paths: the CPU kernel (traced head counts) and the accelerators' plain
    JAX path, where the layout runs each group's attention at its static head count."""
    from mhjax.io.checkpoint import SweepCheckpointer

    grouped = tiny_sequence_config(task=("copy", "cycle"), heads=(2, 1))
    one = tiny_sequence_config(task=("copy", "cycle"), heads=(2, 1))
    one.strategy = "one_program"
    grouped.attention = one.attention = implementation
    sg, tg = train(grouped)
    so, to = train(one)
    [program] = so.programs
    members, recipe = so.experiment.members, program.recipe
    # members listed head count by head count; each group's static head count is its members'
    assert program.name == "all" and recipe.model.layout == ((2, 1), (2, 2)) and recipe.vmap_inside_grad
    assert [members[i].name for i in program.members] == ["copy-h1-s0", "cycle-h1-s0", "copy-h2-s0", "cycle-h2-s0"]
    assert pricing.program_groups(so.programs) == [[(2, 1, False), (2, 2, False)]]
    for m in members:
        assert_trees_close(member_params(sg, tg, m.name), member_params(so, to, m.name))
    eval_grouped, eval_one = sg.evaluate(tg), so.evaluate(to)
    assert sorted(eval_one) == [0, 1, 2, 3]
    for i in eval_grouped:
        assert eval_grouped[i] == pytest.approx(eval_one[i], rel=1e-4), i
    # checkpoints keep one entry per member: written under one_program, read under grouped
    checkpointer = SweepCheckpointer(str(tmp_path))
    so.save(checkpointer, 4, to, {m.name: 1.0 for m in members})
    restored, _ = sg.restore(checkpointer, 4)
    for m in members:
        assert_trees_close(member_params(sg, restored, m.name), member_params(so, to, m.name), tol=0)


def _auto(**fields):
    """A tiny sequence experiment under strategy=auto (the plan's strategy: auto's choice)."""
    config = tiny_sequence_config(**fields)
    config.strategy = "auto"
    return make_experiment(config)


def test_auto_strategy_on_accelerators_follows_the_cost_model(monkeypatch):
    from mhjax.models import cost

    config = tiny_sequence_config(heads=(1, 2, 4))
    config.strategy = "auto"  # the plan's strategy is auto's choice
    experiment = make_experiment(config)
    monkeypatch.setattr(jax, "device_count", lambda *a: 1)
    # fused pays 4 fine heads and their mixing for every member: one vmapped group per H instead
    plan = experiment.plan("gpu")
    assert plan.strategy == "one_program"
    rates = {s: plan.predict(s)["member_steps_per_s"] for s in ("fused", "grouped", "one_program")}
    assert rates["one_program"] == rates["grouped"] > rates["fused"]
    # on a TPU the kernel's grid steps (0.35 us each, models/cost_tpu.py) outweigh this tiny
    # model's whole attention: fused's JAX path is predicted faster, and auto follows the rates
    plan = experiment.plan("tpu")
    rates = {s: plan.predict(s)["member_steps_per_s"] for s in ("fused", "grouped", "one_program")}
    assert rates["one_program"] == rates["grouped"] < rates["fused"] and plan.strategy == "fused"
    shape = cost.Shape.of(config)
    device = cost.DEVICES["h200"]
    fused = cost.member_cost(shape, 4, mixed=True)
    expected = 1 / cost.step_seconds(fused, device)  # each member takes one fused step
    assert experiment.plan("gpu").predict("fused")["member_steps_per_s"] == pytest.approx(expected)
    # one head count: fused is the same program as one_program's single group, and wins the tie
    assert _auto(heads=(4,), seed=(0, 1)).plan("gpu").strategy == "fused"
    # several devices: one_program's two members sharded over 2 devices, each device running its
    # own member's head count (models/member_layout.py), beat fused's fine heads and grouped's
    # one-member programs every device computes in full ...
    monkeypatch.setattr(jax, "device_count", lambda *a: 2)
    two = _auto(heads=(1, 2))
    rates = {s: two.plan("gpu").predict(s)["member_steps_per_s"] for s in ("fused", "grouped", "one_program")}
    assert rates["one_program"] > rates["grouped"] and rates["one_program"] > rates["fused"]
    assert two.plan("gpu").strategy == "one_program"
    # ... and when every head count's program shards too, one_program ties grouped, with one program
    assert _auto(heads=(1, 2), seed=(0, 1)).plan("gpu").strategy == "one_program"
    on_two = two.plan("gpu").predict("grouped")  # devices are counted when predicting
    # planned for a target's devices, not this machine's (train/deviceless.py)
    monkeypatch.setattr(jax, "device_count", lambda *a: 1)
    planned = _auto(heads=(1, 2))
    assert planned.plan("gpu", 2, planned=True).strategy == "one_program"
    assert planned.plan("gpu", 2, planned=True).predict("grouped") == on_two and on_two["per_device"]["devices"] == 2


def test_one_program_spreads_its_groups_over_the_planned_devices():
    experiment = make_experiment(tiny_sequence_config(heads=(1, 2), seed=(0, 1, 2, 3)))
    [single] = experiment.programs("one_program", "gpu")
    assert single.recipe.model.layout == ((4, 1), (4, 2))
    # each device's half holds two members of each head count
    [spread] = experiment.plan("gpu", 2, planned=True).programs_for("one_program")
    heads = [experiment.members[i]["heads"] for i in spread.members]
    assert heads == [1, 1, 2, 2, 1, 1, 2, 2] and sorted(spread.members) == sorted(single.members)
    assert spread.recipe.model.layout == ((2, 1), (2, 2), (2, 1), (2, 2))


def test_auto_strategy_unrolls_long_cpu_runs_and_fuses_otherwise():
    from mhjax.train.engine import Unrolled

    config = tiny_sequence_config(task=("copy", "cycle"), heads=(1, 2, 4))
    config.train.steps = 20_000
    experiment = make_experiment(config)
    [program] = experiment.programs("auto", "cpu")
    recipe = program.recipe
    assert program.name == "all" and program.members == list(range(6)) and isinstance(recipe, Unrolled)
    # each member its own group, at its own static head count
    assert recipe.sizes == (1,) * 6
    assert [r.model.num_heads for r in recipe.recipes] == [m["heads"] for m in experiment.members]
    config.train.steps = 200  # a short run: compile time would eat the gain
    [short] = make_experiment(config).programs("auto", "cpu")
    assert not isinstance(short.recipe, Unrolled)


def test_auto_strategy_keeps_the_vmapped_axis_when_sharding(monkeypatch):
    from mhjax.train.engine import Unrolled

    config = tiny_sequence_config(heads=(1, 2))
    config.train.steps = 20_000
    monkeypatch.setattr(jax, "device_count", lambda *a: 4)
    [sharded] = make_experiment(config).programs("auto", "cpu")
    assert not isinstance(sharded.recipe, Unrolled)
    config.devices = 1  # the user pinned one device
    [single] = make_experiment(config).programs("auto", "cpu")
    assert isinstance(single.recipe, Unrolled)


def test_unrolled_groups_slice_the_member_axis_and_reject_bad_sizes():
    import jax.numpy as jnp

    from mhjax.train.engine import Unrolled, over_members

    program = Unrolled(["a", "b"], (1, 3))
    parts = program.split({"x": jnp.arange(4)})
    assert [p["x"].tolist() for p in parts] == [[0], [1, 2, 3]]
    lifted = over_members(program, lambda kernel, x: x * (10 if kernel == "a" else 100))
    assert lifted(jnp.arange(4)).tolist() == [0, 100, 200, 300]
    with pytest.raises(ValueError, match="group size"):
        Unrolled(["a"], (0,))


def test_training_changes_params_and_lowers_loss():
    config = tiny_sequence_config(heads=(2,))
    sweep = Sweep(make_experiment(config), backend="cpu")
    states = sweep.init_states()
    before = sweep.evaluate(states)[0]["eval_loss"]
    states = sweep.train(states, 60, 20)
    after = sweep.evaluate(states)[0]["eval_loss"]
    assert after < before - 0.5


def test_diverging_member_is_frozen_and_reported(tmp_path):
    config = tiny_sequence_config(heads=(2,), learning_rate=(3e-3, 1e30))
    messages = []
    payload = run(make_experiment(config), str(tmp_path / "w"), progress=False, log=messages.append)
    by_lr = {m["learning_rate"]: m for m in payload["members"]}
    bad, good = by_lr[1e30], by_lr[3e-3]
    assert bad["status"] == "diverged" and 0 <= bad["diverged_at_step"] < config.train.steps
    reports = [m for m in messages if m.startswith("member ")]  # once, naming the member and the step
    assert (
        len(reports) == 1 and bad["name"] in reports[0] and f"diverged at step {bad['diverged_at_step']}" in reports[0]
    )
    assert bad["nonfinite_at_step"] == bad["diverged_at_step"] and bad["loss_exceeded_at_step"] is None
    assert "non-finite" in bad["diverged_reason"]
    # named again at the end, with the reason
    closing = messages[messages.index(next(m for m in messages if "members diverged" in m)) :]
    assert (
        closing[0].startswith("1 of 2 members diverged")
        and bad["name"] in closing[1]
        and good["name"] not in closing[1]
    )
    assert good["status"] == "ok" and np.isfinite(good["train_loss"])
    assert good["diverged_at_step"] is None  # a field of every record, null when healthy
    assert good["initial_train_loss"] >= good["train_loss"] and good["max_train_loss"] >= good["initial_train_loss"]
    # Frozen: the diverged member's checkpointed params are finite (the bad update was rejected).
    sweep = Sweep(make_experiment(config), backend="cpu")
    from mhjax.io.workdir import Workdir

    ckpt = Workdir(tmp_path / "w").checkpointer()
    states, _ = sweep.restore(ckpt, ckpt.latest_step())
    params = member_params(sweep, states, bad["name"])
    assert all(np.all(np.isfinite(x)) for x in jax.tree_util.tree_leaves(params))


def test_run_writes_outputs_and_resume_does_not_retrain(tmp_path):
    workdir = str(tmp_path / "w")
    config = tiny_sequence_config(task=("copy", "cycle"), heads=(2,))  # one program: one compile
    first = run(make_experiment(config), workdir, progress=False, log=lambda m: None)
    results = json.load(open(os.path.join(workdir, "results.json")))
    assert len(results["members"]) == 2
    for member in results["members"]:
        for key in (
            "name",
            "task",
            "heads",
            "seed",
            "params",
            "steps",
            "train_loss",
            "eval_loss",
            "eval_accuracy",
            "program_wall_time_s",
        ):
            assert key in member
        assert member["steps"] == config.train.steps
        assert member["wall_time_s"] == member["program_wall_time_s"]  # the older name, kept for scripts
        assert os.listdir(os.path.join(workdir, "tb", member["name"]))  # event file
    with open(os.path.join(workdir, "results.md")) as f:
        header = f.read().splitlines()[2]
    assert "program_wall_time_s" in header and "| wall_time_s |" not in header  # one name in tables
    messages = []
    written = open(os.path.join(workdir, "results.json"), "rb").read()
    second = run(make_experiment(config), workdir, progress=False, log=messages.append)
    # nothing trained: results.json kept byte for byte, with the training run's resumed_from_step
    assert open(os.path.join(workdir, "results.json"), "rb").read() == written
    assert second["resumed_from_step"] == first["resumed_from_step"] is None
    assert any("not retraining" in m for m in messages)
    for a, b in zip(first["members"], second["members"]):
        assert (
            a["eval_loss"] == b["eval_loss"]
            and a["train_loss"] == b["train_loss"]
            and a["program_wall_time_s"] == pytest.approx(b["program_wall_time_s"])
        )


@pytest.mark.slow  # ~36 s: test_reliability resumes mid-run bit-identical
def test_resume_midway_equals_uninterrupted(tmp_path):
    config = tiny_sequence_config(heads=(1, 2))
    full = run(make_experiment(config), str(tmp_path / "full"), progress=False, log=lambda m: None)
    half = tiny_sequence_config(heads=(1, 2))
    half.train.steps = 3
    run(make_experiment(half), str(tmp_path / "part"), progress=False, log=lambda m: None)
    # Same workdir, a larger train.steps: the finished run trains longer.
    resumed = run(make_experiment(config), str(tmp_path / "part"), progress=False, log=lambda m: None)
    assert resumed["resumed_from_step"] == 3
    for a, b in zip(full["members"], resumed["members"]):
        assert a["eval_loss"] == b["eval_loss"] and a["train_loss"] == b["train_loss"]


def test_other_config_in_workdir_is_refused(tmp_path):
    from mhjax.config import ConfigError

    workdir = str(tmp_path / "w")
    run(make_experiment(tiny_sequence_config(heads=(1,))), workdir, progress=False, log=lambda m: None)
    with pytest.raises(ConfigError, match="another config"):
        run(make_experiment(tiny_sequence_config(heads=(2,))), workdir, progress=False, log=lambda m: None)


def test_one_program_diverging_member_leaves_the_others_exact():
    """one_program takes one gradient of the summed member losses: a member whose loss turns
    non-finite must still be frozen alone, its neighbours training exactly as in grouped."""
    grouped = tiny_sequence_config(heads=(1, 2), learning_rate=(3e-3, 1e30))
    one = tiny_sequence_config(heads=(1, 2), learning_rate=(3e-3, 1e30))
    one.strategy = "one_program"
    grouped.attention = one.attention = "jax"  # the layout runs on this path (and the Pallas kernel's)
    sg, tg = train(grouped, steps=6)
    so, to = train(one, steps=6)
    [program] = so.programs
    diverged = dict(zip(program.members, np.asarray(to["all"].diverged).tolist()))
    for i, m in enumerate(so.experiment.members):
        assert diverged[i] == (m["learning_rate"] == 1e30), m.name
        if not diverged[i]:
            assert_trees_close(member_params(sg, tg, m.name), member_params(so, to, m.name))


def test_members_differing_only_in_learning_rate_share_their_draws():
    """The learning rate stays out of the key: every rate starts from the same init (and draws the
    same dropout masks), so a rate sweep is a paired comparison; a member of it equals itself
    trained alone; and the rate still changes what is trained."""
    config = tiny_sequence_config(heads=(2,), learning_rate=(1e-3, 3e-3))
    sweep = Sweep(make_experiment(config), backend="cpu")
    slow, fast = "copy-h2-lr0.001-s0", "copy-h2-lr0.003-s0"
    assert [m.name for m in sweep.experiment.members] == [slow, fast]
    init = sweep.init_states()
    assert_trees_close(member_params(sweep, init, slow), member_params(sweep, init, fast), tol=0)
    states = sweep.train(init, 4, 2)
    moved = [
        np.abs(np.asarray(a) - np.asarray(b)).max()
        for a, b in zip(
            jax.tree_util.tree_leaves(member_params(sweep, states, slow)),
            jax.tree_util.tree_leaves(member_params(sweep, states, fast)),
        )
    ]
    assert max(moved) > 1e-3
    alone_sweep, alone = train(tiny_sequence_config(heads=(2,), learning_rate=(3e-3,)))
    assert_trees_close(member_params(sweep, states, fast), member_params(alone_sweep, alone, "copy-h2-s0"))
