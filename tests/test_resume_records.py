"""Nothing results.json reports is lost on resume: a sweep stopped in the middle (killed: no
checkpoint at the stop; or Ctrl-C: a checkpoint at the stop) and run again writes the results of
the uninterrupted run, the recorded loss points (loss_curve, loss_slope) included. In process:
the kill is an exception out of a training chunk, Ctrl-C a real SIGINT to this process."""

import json
import os
import signal

import numpy as np
import pytest

from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.io import trace
from mhjax.io.workdir import Workdir
from mhjax.train import loop
from mhjax.train.loop import Interrupted, Sweep, run
from tests.conftest import tiny_sequence_config, tiny_train
from tests.tb_scalars import assert_same_scalars
from tests.test_mixture_sweep import tiny_mixture_config

SIGNALS = {"sigint": signal.SIGINT, "sigterm": signal.SIGTERM, "sigusr1": signal.SIGUSR1}


class Killed(Exception):
    """Stands for SIGKILL: the run ends where it is, nothing more is written."""


def mixture_config():
    config = tiny_mixture_config(heads=(1, 2), num_train=(8,))
    with config.train.unlocked():
        config.train.update(dict(steps=20, chunk_steps=5, eval_every=10, checkpoint_every=10, loss_points=12))
    return config


def sequence_config():
    return tiny_train(tiny_sequence_config(heads=(1, 2)), 9, 3, 3, 6)  # grouped: 2 programs


def stop_at_chunk(monkeypatch, calls: int, how: str):
    """Stop the run when its ``calls``-th training chunk (over all programs) has run."""
    original, count = Sweep.run_chunk, [0]

    def run_chunk(self, program, states, length):
        out = original(self, program, states, length)
        count[0] += 1
        if count[0] == calls:
            if how == "kill":
                raise Killed
            signal.raise_signal(SIGNALS[how])  # handled between chunks: checkpoint, then Interrupted
        return out

    monkeypatch.setattr(Sweep, "run_chunk", run_chunk)


def comparable(payload):
    timings = ("member_steps_per_s", "tokens_per_s", "mfu")  # this process's rates, like the wall times
    out = {k: v for k, v in payload.items() if k != "resumed_from_step" and k not in timings}
    out["members"] = [
        {k: v for k, v in m.items() if k not in ("program_wall_time_s", "wall_time_s")} for m in payload["members"]
    ]
    return out


def assert_same(a, b, path="results"):
    if isinstance(a, dict):
        assert sorted(a) == sorted(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert b == pytest.approx(a, rel=1e-6, abs=1e-6, nan_ok=True), path
    else:
        assert a == b, path


def results(workdir):
    with open(os.path.join(workdir, "results.json")) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted runs of both experiments: {kind: results.json}."""
    out = {}
    for kind, config in (("sequence", sequence_config()), ("mixture", mixture_config())):
        workdir = str(tmp_path_factory.mktemp(kind))
        run(make_experiment(config), workdir, progress=False, log=lambda m: None)
        out[kind] = results(workdir)
        out[f"{kind} workdir"] = workdir
    return out


@pytest.mark.parametrize(
    "kind, how, chunk, resumed_from",
    [
        # sequence: 2 programs (h1, h2), chunks of 3 steps, checkpoints at 6 and 9
        ("sequence", "kill", 5, 6),  # killed during steps 6-9
        pytest.param("sequence", "sigint", 2, 3, marks=pytest.mark.slow),  # Ctrl-C after steps 0-3 (test_cli too)
        # mixture: 1 program, chunks of 5 steps, checkpoints at 10 and 20, loss points up to 20
        ("mixture", "kill", 3, 10),  # killed after the first checkpoint
        ("mixture", "kill", 4, 10),  # killed with steps 10-14 traced past the checkpoint
        ("mixture", "sigint", 3, 15),  # Ctrl-C after the first checkpoint
        ("mixture", "sigterm", 2, 10),  # a scheduler's SIGTERM: the same stop, the requeue exit code
    ],
)
def test_an_interrupted_sweep_resumed_writes_the_uninterrupted_results(
    reference, tmp_path, monkeypatch, kind, how, chunk, resumed_from
):
    config = sequence_config() if kind == "sequence" else mixture_config()
    workdir = str(tmp_path / "w")
    lines = []
    with monkeypatch.context() as patch:
        stop_at_chunk(patch, chunk, how)
        with pytest.raises(Killed if how == "kill" else Interrupted) as stopped:
            run(make_experiment(config), workdir, progress=False, log=lines.append)
    if how == "sigterm":  # the one line: signal, step, the command that resumes
        assert stopped.value.exit_status == 75
        assert str(stopped.value).startswith(f"SIGTERM: stopped at step {resumed_from}, checkpoint written; resume: ")
        assert lines[-1].startswith("graceful stop on SIGTERM/SIGUSR1/SIGUSR2: at the running chunk's end")
    assert not os.path.exists(os.path.join(workdir, "results.json"))
    names = [m.name for m in make_experiment(config).members]
    if kind == "mixture":  # a kill in the middle of writing the trace leaves a partial record
        with open(os.path.join(Workdir(workdir).trace_dir, f"{names[0]}.bin"), "ab") as f:
            f.write(b"\x00" * 5)
    run(make_experiment(config), workdir, progress=False, log=lines.append)
    assert f"resuming from checkpoint at step {resumed_from}" in lines
    got = results(workdir)
    assert got["resumed_from_step"] == resumed_from
    assert_same(comparable(reference[kind]), comparable(got))
    if kind == "mixture":  # the trace: every step once, the values of the uninterrupted run
        for name in names:
            got_trace = trace.read(Workdir(workdir).trace_dir, name)
            want_trace = trace.read(Workdir(reference["mixture workdir"]).trace_dir, name)
            assert list(got_trace["step"]) == list(range(20))
            for field, values in want_trace.items():
                np.testing.assert_allclose(got_trace[field], values, rtol=1e-6, err_msg=field)
    if kind == "mixture":  # TensorBoard: the straight run's points (a kill's after the checkpoint dropped)
        assert_same_scalars(reference["mixture workdir"], workdir, names)
        assert f"tensorboard: points of earlier runs at steps >= {resumed_from} dropped" in " ".join(lines)
    if kind == "mixture":  # the points before the checkpoint are there, as in the uninterrupted run
        for member in got["members"]:
            assert member["loss_curve"]["steps"][0] == 0 and len(member["loss_curve"]["steps"]) > 5
            assert member["loss_slope"] is not None


def test_sweep_train_records_the_loss_points_like_the_host_loop(reference):
    """Sweep.train (no host loop) records L(theta_k) at the same k with the same values."""
    experiment = make_experiment(mixture_config())
    sweep = Sweep(experiment)
    sweep.train(sweep.init_states(), 20, 5)
    for i, member in enumerate(reference["mixture"]["members"]):
        curve = sweep.records.loss_curves[i]
        want = member["loss_curve"]  # the loop's curve, with k = K appended
        assert curve["steps"] == want["steps"][:-1] and curve["steps"] == experiment.loss_steps()
        assert curve["values"] == pytest.approx(want["values"][:-1], rel=1e-6)


def test_a_checkpoint_without_records_still_resumes_and_says_where_the_curve_starts(tmp_path, monkeypatch):
    """Checkpoints written before the host records existed (the states alone) stay resumable."""
    config = mixture_config()
    workdir = str(tmp_path / "w")
    monkeypatch.setattr(loop.HostRecords, "to_json", lambda self: None)  # save the states alone
    with monkeypatch.context() as patch:
        stop_at_chunk(patch, 3, "kill")
        with pytest.raises(Killed):
            run(make_experiment(config), workdir, progress=False, log=lambda m: None)
    assert not os.path.isdir(os.path.join(workdir, "checkpoints", "10", "records"))
    lines = []
    run(make_experiment(config), workdir, progress=False, log=lines.append)
    assert "checkpoint 10 predates recorded loss points: loss_curve starts at step 10" in lines
    assert all(m["loss_curve"]["steps"][0] >= 10 for m in results(workdir)["members"])


def test_a_finished_run_trained_longer_equals_the_straight_run(tmp_path):
    """A larger config.train.steps continues a finished workdir from its latest checkpoint: results,
    curves and mhjax.json as if it had been trained to the larger count at once (fixed strategy)."""
    straight, extended = str(tmp_path / "straight"), str(tmp_path / "extended")
    run(make_experiment(sequence_config()), straight, progress=False, log=lambda m: None)
    run(
        make_experiment(tiny_train(tiny_sequence_config(heads=(1, 2)), 6, 3, 3, 6)),
        extended,
        progress=False,
        log=lambda m: None,
    )
    lines = []
    run(make_experiment(sequence_config()), extended, progress=False, log=lines.append)
    assert "resuming from checkpoint at step 6" in lines
    got, want = results(extended), results(straight)
    assert got["resumed_from_step"] == 6 and got["steps"] == 9
    assert_same(comparable(want), comparable(got))
    with open(os.path.join(extended, "mhjax.json")) as f:
        meta = json.load(f)
    assert meta["config"]["train"]["steps"] == 9 and meta["extended_from_steps"] == [6]
    from mhjax.io.workdir import Workdir

    for name in (m["name"] for m in want["members"]):
        a, b = Workdir(straight).curves(name), Workdir(extended).curves(name)
        for tag in ("eval/loss", "eval/accuracy", "train/loss"):
            assert list(a[tag][0]) == list(b[tag][0]), tag  # the same steps, 0 to 9
            assert b[tag][1] == pytest.approx(a[tag][1], rel=1e-6), tag
    # a smaller count is another config
    with pytest.raises(ConfigError, match="holds a run of another config .config.train.steps: stored 9, now 3."):
        run(
            make_experiment(tiny_train(tiny_sequence_config(heads=(1, 2)), 3, 3, 3, 6)),
            extended,
            progress=False,
            log=lambda m: None,
        )


def test_a_mixture_run_refuses_to_train_longer_saying_why(tmp_path):
    config = mixture_config()
    with config.train.unlocked():
        config.train.update(dict(steps=10))
    workdir = str(tmp_path / "w")
    run(make_experiment(config), workdir, progress=False, log=lambda m: None)
    with pytest.raises(ConfigError) as exc:
        run(make_experiment(mixture_config()), workdir, progress=False, log=lambda m: None)
    assert "\n" not in str(exc.value)
    assert "holds a run of 10 steps: a mixture sweep cannot train longer, as its K" in str(exc.value)


def test_a_checkpoint_without_the_loss_path_still_resumes_and_says_from_where_it_is_checked(tmp_path, monkeypatch):
    """Checkpoints written before MemberState kept the loss path (engine.PATH_FIELDS) resume; the
    path is checked from the checkpoint on, and the rest of the results are those of a straight run."""
    from mhjax.train import engine

    config = mixture_config()
    workdir = str(tmp_path / "w")
    original = Sweep.member_states
    old = lambda self, states: {n: engine.without_path(s) for n, s in original(self, states).items()}
    with monkeypatch.context() as patch:
        patch.setattr(Sweep, "member_states", old)  # save the states as mhjax did before the path fields
        stop_at_chunk(patch, 3, "kill")
        with pytest.raises(Killed):
            run(make_experiment(config), workdir, progress=False, log=lambda m: None)
    lines = []
    run(make_experiment(config), workdir, progress=False, log=lines.append)
    assert "checkpoint 10 predates the loss-path records: divergence is checked from step 10 on" in lines
    for member in results(workdir)["members"]:
        assert member["status"] == "ok" and member["initial_train_loss"] is None  # theta_0's loss was not kept
        assert member["max_train_loss"] > 0 and member["loss_exceeded_at_step"] is None


# ~12 s: test_snapshots and the kill tests cover each half
@pytest.mark.slow
def test_snapshots_written_survive_a_kill_a_resume_and_training_longer(tmp_path, monkeypatch):
    """Killed during steps 3-6 (snapshots 0 and 3 written, no checkpoint yet), run again, then
    trained longer with other snapshot steps: every snapshot written is kept as written, and each
    holds the parameters of its step (the one at 6 equals checkpoint 6, the one at 9 checkpoint 9)."""
    import numpy as np

    from mhjax.io.workdir import Workdir

    def snapshot_config(steps, snapshot_steps):
        config = tiny_train(tiny_sequence_config(heads=(1, 2)), steps, 3, 3, 6)
        with config.train.unlocked():
            config.train.snapshot_steps = snapshot_steps
        return config

    workdir = Workdir(str(tmp_path / "w"))
    with monkeypatch.context() as patch:
        stop_at_chunk(patch, 3, "kill")  # 2 programs: the 3rd chunk call is steps 3-6
        with pytest.raises(Killed):
            run(make_experiment(snapshot_config(6, (0, 3, 6))), workdir.path, progress=False, log=lambda m: None)
    assert workdir.snapshot_steps() == [0, 3] and workdir.checkpoint_steps() == []
    written = {s: os.path.getmtime(os.path.join(workdir.snapshots_dir, str(s))) for s in (0, 3)}
    run(make_experiment(snapshot_config(6, (0, 3, 6))), workdir.path, progress=False, log=lambda m: None)
    lines = []
    run(make_experiment(snapshot_config(9, "log:4")), workdir.path, progress=False, log=lines.append)
    assert "resuming from checkpoint at step 6" in lines  # snapshot_steps changed: still the same run
    assert workdir.snapshot_steps() == [0, 3, 6, 9]  # log:4 of 9 steps is 0, 1, 3, 9: 1 was past
    assert {s: os.path.getmtime(os.path.join(workdir.snapshots_dir, str(s))) for s in (0, 3)} == written
    snapshotter = workdir.snapshotter()
    try:
        for step in (6, 9):
            snapshot = snapshotter.restore_raw(step)["members"]
            for name, state in workdir.member_states(step).items():
                for a, b in zip(jax_leaves(snapshot[name]["params"]), jax_leaves(state["params"]), strict=True):
                    assert np.array_equal(a, b)
    finally:
        snapshotter.close()


def jax_leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


def test_the_evaluation_written_again_at_a_resume_is_where_the_straight_run_evaluated():
    """Chunks of 3 to 12, eval_every 5: the straight run evaluates at the chunk ends 6 (crossing
    5), 12 (crossing 10, and the end) and at the asked step 3; not at 9. A checkpoint at a
    finished run's last step (trained longer since) had its evaluation there."""
    from mhjax.train.resume_curves import evaluated_at

    config = tiny_train(tiny_sequence_config(heads=(1,)), 12, 3, 5, 3)
    assert [evaluated_at(s, config, [3], None) for s in (3, 6, 9, 12)] == [True, True, False, True]
    assert evaluated_at(9, config, [3], finished_at=9)
    assert not evaluated_at(7, config, [3], None)  # a snapshot's cut (a signal stopped it there): no evaluation
