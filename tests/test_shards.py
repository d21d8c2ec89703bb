"""A sweep trained as independent shards (``mhjax train --shard I/N``, workflows/shards.py): the
split (whole programs balanced by the cost model, a program halved only with more shards than
programs), the merge into one results.json equal to the one-job run's, concurrent shard writes
that lose nothing, and bad input refused in one line with nothing written."""

import hashlib
import itertools
import json
import os
import subprocess
import sys

import pytest

import mhjax
from mhjax.cli import main
from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.io.results import RUN_FIELDS
from mhjax.io.workdir import Workdir
from mhjax.workflows import shards
from mhjax.workflows.analyze import analyze_workdir
from mhjax.workflows.train import train
from tests.conftest import ROOT, config_source, tiny_sequence_config

WALL = ("program_wall_time_s", "wall_time_s")  # a program's measured time: the one field runs differ in


def _quiet(_):
    pass


def _comparable(results: dict) -> dict:
    rates = {k: None for k in RUN_FIELDS if k in results and k != "resumed_from_step"}  # measured, as wall times
    members = [{k: v for k, v in m.items() if k not in WALL} for m in results["members"]]
    return {**results, **rates, "members": members}


def _read(workdir) -> dict:
    with open(Workdir(workdir).results_path) as f:
        return json.load(f)


def _digests(folder) -> dict:
    out = {}
    for root, _, files in os.walk(folder):
        for name in files:
            with open(os.path.join(root, name), "rb") as f:
                out[os.path.relpath(os.path.join(root, name), folder)] = hashlib.sha256(f.read()).hexdigest()
    return out


# ---------------------------------------------------------------------------------------------- #
# The split
# ---------------------------------------------------------------------------------------------- #
def test_shares_are_whole_programs_balanced_by_the_cost_model():
    """Four programs of unequal cost (head_dim 4 and 8, heads 1 and 4) over 2 shards: each shard
    holds whole programs, and the busier shard's predicted time is the least any split of whole
    programs reaches (brute force over every assignment)."""
    experiment = make_experiment(tiny_sequence_config(heads=(1, 4), head_dim=(4, 8)))
    programs = experiment.programs("grouped", "cpu")
    cost = {p.name: experiment.plan("cpu").step_seconds(p) for p in programs}
    assert len(set(cost.values())) == 4  # the cost model tells them apart
    shares = shards.plan(experiment, 2, "cpu")
    names = {p.name: {experiment.members[i].name for i in p.members} for p in programs}
    held = []
    for share in shares:
        assert share["split"] == []
        whole = [p for p, members in names.items() if members <= set(share["members"])]
        assert set().union(*(names[p] for p in whole)) == set(share["members"])  # whole programs only
        held.append(sum(cost[p] for p in whole))
    assert sorted(m for s in shares for m in s["members"]) == sorted(m.name for m in experiment.members)
    best = min(
        max(sum(cost[p] for p, s in zip(cost, side) if s == k) for k in (0, 1))
        for side in itertools.product((0, 1), repeat=len(cost))
    )
    assert max(held) == pytest.approx(best)


def test_more_shards_than_programs_split_a_program_and_say_so():
    experiment = make_experiment(tiny_sequence_config(heads=(1, 2), seed=(0, 1)))  # 2 programs of 2 members
    shares = shards.plan(experiment, 3, "cpu")
    assert sorted(m for s in shares for m in s["members"]) == sorted(m.name for m in experiment.members)
    assert all(s["members"] for s in shares)
    split = [s for s in shares if s["split"]]
    assert len(split) == 2 and {tuple(s["split"]) for s in split} == {("h2",)}  # the costlier program, halved
    with pytest.raises(ConfigError, match=r"--shard: N must be in \[1, 4\]"):
        shards.plan(experiment, 5, "cpu")


# ---------------------------------------------------------------------------------------------- #
# Bad input: one line, exit 2, nothing written
# ---------------------------------------------------------------------------------------------- #
@pytest.fixture
def config_file(tmp_path):
    path = tmp_path / "tiny.py"
    path.write_text(config_source(tiny_sequence_config(heads=(1, 2, 4), seed=(0, 1))))
    return str(path)


def _refused(capsys, args, match) -> None:
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mhjax: error: --"), err
    assert match in err[0], err


@pytest.mark.parametrize(
    "shard, match",
    [("0/0", "N must be >= 1"), ("3/2", "I must be in [0, 2)"), ("-1/4", "I must be in [0, 4)"), ("x", "I/N")],
)
def test_a_bad_shard_is_refused_before_anything_is_written(tmp_path, capsys, config_file, shard, match):
    workdir = tmp_path / "w"
    # --shard=-1/4: argparse would read a bare -1/4 as an option (and refuse it in its own line)
    _refused(capsys, ["train", "--config", config_file, "--workdir", str(workdir), f"--shard={shard}"], match)
    assert not workdir.exists()


def test_more_shards_than_members_is_refused_before_anything_is_written(tmp_path, capsys, config_file):
    workdir = tmp_path / "w"
    _refused(
        capsys, ["train", "--config", config_file, "--workdir", str(workdir), "--shard", "0/7"], "N must be in [1, 6]"
    )
    assert not workdir.exists()


def test_shard_with_distributed_is_refused(tmp_path, capsys, config_file):
    workdir = tmp_path / "w"
    args = ["train", "--config", config_file, "--workdir", str(workdir), "--shard", "0/2", "--distributed"]
    _refused(capsys, args, "not with --distributed")
    assert not workdir.exists()


@pytest.fixture
def four_shards(tmp_path):
    """A workdir started as 4 shards (planned and recorded, nothing trained)."""
    workdir = Workdir(tmp_path / "w4")
    experiment = make_experiment(tiny_sequence_config(heads=(1, 2, 4), seed=(0, 1)))
    assert [j for j, _, _ in shards.prepare(experiment, workdir, 0, 4, "cpu")] == [0]
    assert workdir.shard_count() == 4 and len(workdir.metadata()["sweep_history"]) == 4
    return workdir


@pytest.mark.parametrize(
    "more, match",
    [
        (["--shard", "2/3"], "was started as 4 shards: use I/M with M one of 4, 2, 1"),
        (["--shard", "1/4", "--config.model.width=32"], "holds a run of another config (config.model.width"),
        ([], "was started as 4 shards; train each with --shard I/4"),
    ],
)
def test_a_shard_that_does_not_fit_the_workdir_is_refused(four_shards, capsys, config_file, more, match):
    before = _digests(four_shards.path)
    _refused(capsys, ["train", "--config", config_file, "--workdir", four_shards.path, *more], match)
    assert _digests(four_shards.path) == before


def test_fewer_shards_train_whole_recorded_shards_one_after_the_other(four_shards):
    assert shards.recorded_shards(0, 2, 4) == [0, 2] and shards.recorded_shards(1, 2, 4) == [1, 3]
    assert shards.recorded_shards(0, 1, 4) == [0, 1, 2, 3] and shards.recorded_shards(3, 4, 4) == [3]
    experiment = make_experiment(tiny_sequence_config(heads=(1, 2, 4), seed=(0, 1)))
    resumed = shards.prepare(experiment, four_shards, 1, 2, "cpu")
    history = four_shards.metadata()["sweep_history"]
    assert [j for j, _, _ in resumed] == [1, 3]
    for j, part, entry in resumed:  # each recorded shard in its own folder, with its own members
        assert entry == history[j] and part.workdir.folder == f"shards/{j}"
        assert [m.name for m in part.experiment.members] == list(history[j]["members"])


def test_a_workdir_trained_as_one_job_is_not_sharded(tmp_path, capsys, config_file):
    workdir = Workdir(tmp_path / "one")
    experiment = make_experiment(tiny_sequence_config(heads=(1, 2, 4), seed=(0, 1)))
    workdir.check_or_write_metadata(experiment.config.to_dict(), experiment.kind, experiment.metadata())
    before = _digests(workdir.path)
    _refused(capsys, ["train", "--config", config_file, "--workdir", workdir.path, "--shard", "0/2"], "as one job")
    assert _digests(workdir.path) == before


# ---------------------------------------------------------------------------------------------- #
# Concurrent writes: real processes, nothing lost
# ---------------------------------------------------------------------------------------------- #
_WRITER = """
import sys
from mhjax.io.workdir import Workdir
workdir, me, count, order = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4].split(",")
view = Workdir(workdir).part(f"shards/{me}", order)
for n in range(count):  # one merge per member: as many chances to lose another shard's entries
    name = f"m{me}-{n}"
    member = {"name": name, "program": f"p{me}"}
    view.write_results({"title": "t", "steps": 1, "programs": {f"p{me}": [name]}, "members": [member]})
"""


def test_shards_writing_results_at_once_lose_nothing(tmp_path):
    shards_, count = 3, 15
    order = [f"m{s}-{n}" for s in range(shards_) for n in range(count)]
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(s), str(count), ",".join(order)], env=env)
        for s in range(shards_)
    ]
    assert [p.wait(timeout=120) for p in procs] == [0] * shards_
    results = _read(tmp_path)
    assert [m["name"] for m in results["members"]] == order
    assert "missing_members" not in results
    assert results["programs"] == {f"p{s}": order[s * count : (s + 1) * count] for s in range(shards_)}


def test_a_filesystem_without_posix_locks_is_named(tmp_path, monkeypatch):
    import errno
    import fcntl

    def refuse(*_):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "lockf", refuse)
    with pytest.raises(ConfigError, match="filesystem without POSIX locks .* NFS with locking"):
        Workdir(tmp_path).part("shards/0", ["a"]).write_results({"members": [{"name": "a"}]})
    assert not os.path.exists(Workdir(tmp_path).results_path)


# ---------------------------------------------------------------------------------------------- #
# Shards merge into the one-job run
# ---------------------------------------------------------------------------------------------- #
@pytest.fixture(scope="module")
def one_and_shards(tmp_path_factory):
    """heads 1, 4 (two programs) trained as one job, then as shard 0/2 alone (what readers see
    meanwhile) and shard 1/2."""
    config = tiny_sequence_config(heads=(1, 4))
    root = tmp_path_factory.mktemp("shards")
    train(make_experiment(config), str(root / "one"), progress=False, log=_quiet)
    sharded = str(root / "sharded")
    first = shards.train_shard(make_experiment(config), sharded, 0, 2, progress=False, log=_quiet)
    partial = {
        "results": first,
        "missing": mhjax.load(sharded).missing_members,
        "steps": Workdir(sharded).checkpoint_steps(),
        "params": {m["name"]: mhjax.load(sharded).params(m["name"]) for m in first["members"]},
        "analysed": analyze_workdir(sharded, num_sequences=4, tensorboard=False, plot=False),
    }
    last = shards.train_shard(make_experiment(config), sharded, 1, 2, progress=False, log=_quiet)
    return str(root / "one"), sharded, _read(root / "one"), partial, {"payload": last, "file": _read(sharded)}


def _leaves(tree):
    import jax

    return jax.tree_util.tree_leaves(tree)


def test_readers_see_the_finished_shards_and_name_the_missing_members(one_and_shards):
    one, sharded, _, partial, _ = one_and_shards
    done = [m["name"] for m in partial["results"]["members"]]
    assert len(done) == 1 and partial["missing"] == [n for n in ("copy-h1-s0", "copy-h4-s0") if n not in done]
    assert partial["results"]["missing_members"] == partial["missing"]
    assert partial["steps"] == [3, 6]
    assert sorted(partial["analysed"]["members"]) == done  # analyze reads the finished shard's members
    for name, params in partial["params"].items():  # the one-job run's parameters, bit for bit
        for a, b in zip(_leaves(params), _leaves(mhjax.load(one).params(name)), strict=True):
            assert (a == b).all()


def test_shards_give_the_one_job_runs_results(one_and_shards):
    _, sharded, one, _, last = one_and_shards
    assert "missing_members" not in last["payload"] and mhjax.load(sharded).missing_members == []
    assert _comparable(last["file"]) == _comparable(one)
    assert {m["name"]: m["program"] for m in last["file"]["members"]} == {"copy-h1-s0": "h1", "copy-h4-s0": "h4"}


def test_a_finished_shard_reruns_alone_and_trains_nothing(one_and_shards):
    _, sharded, _, _, last = one_and_shards
    messages = []
    before = open(Workdir(sharded).results_path, "rb").read()
    shards.train_shard(make_experiment(tiny_sequence_config(heads=(1, 4))), sharded, 0, 2, log=messages.append)
    assert any("training already complete at step 6" in m for m in messages)
    assert open(Workdir(sharded).results_path, "rb").read() == before  # nothing trained: results.json kept
    assert _comparable(_read(sharded)) == _comparable(last["file"])


@pytest.mark.slow  # ~3 min on a loaded 2-core machine: a one-job CLI run and three concurrent shard processes
def test_three_concurrent_shard_processes_give_the_one_job_run(tmp_path, config_file):
    env = dict(os.environ, PYTHONPATH=ROOT)
    base = [sys.executable, "-m", "mhjax", "train", "--config", config_file, "--no-progress"]
    one = subprocess.run([*base, "--workdir", str(tmp_path / "one")], env=env, capture_output=True, text=True)
    assert one.returncode == 0, one.stderr
    sharded = str(tmp_path / "sharded")
    procs = [
        subprocess.Popen(
            [*base, "--workdir", sharded, "--shard", f"{i}/3"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for i in range(3)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-2000:] for o in outs]
    assert _comparable(_read(sharded)) == _comparable(_read(tmp_path / "one"))
    history = Workdir(sharded).metadata()["sweep_history"]
    assert [len(e["members"]) for e in history] == [2, 2, 2] and all(e["split_programs"] == [] for e in history)


@pytest.mark.slow  # ~1 min loaded: a one-job run of 4 programs, then 4 shards' worth of training
def test_four_shards_resumed_as_two_give_the_one_job_run(tmp_path):
    """Shards 0/4 and 1/4 trained (2/4 and 3/4 never started: the shards stopped at different
    steps), then the sweep resumed as 2 shards: 0/2 trains recorded shards 0 (done) and 2, 1/2
    shards 1 (done) and 3, each from its own checkpoints."""
    config = tiny_sequence_config(heads=(1, 4), head_dim=(4, 8))  # 4 programs
    one = train(make_experiment(config), str(tmp_path / "one"), progress=False, log=_quiet)
    sharded = str(tmp_path / "sharded")
    for i in (0, 1):
        shards.train_shard(make_experiment(config), sharded, i, 4, progress=False, log=_quiet)
    assert len(Workdir(sharded).missing_members()) == 2
    messages = []
    for i in (0, 1):
        shards.train_shard(make_experiment(config), sharded, i, 2, progress=False, log=messages.append)
    assert sum("training already complete at step 6" in m for m in messages) == 2  # shards 0/4, 1/4
    assert any("shard 0/2 (recorded shard 2/4)" in m for m in messages)
    results = _read(sharded)
    assert _comparable({**results, "resumed_from_step": None}) == _comparable(one)


@pytest.mark.slow  # ~8 s with a warm compile cache, ~30 s cold and loaded: a one-job run, three shards
def test_a_program_split_over_shards_matches_the_one_job_run_to_1e_5(tmp_path):
    """heads 1, 2 x seeds 0, 1 (two programs of two members) over 3 shards: program h2 is halved;
    its members match the one-job run to the fake-device tests' 1e-5, the others bit for bit."""
    config = tiny_sequence_config(heads=(1, 2), seed=(0, 1))
    train(make_experiment(config), str(tmp_path / "one"), progress=False, log=_quiet)
    sharded, messages = str(tmp_path / "sharded"), []
    for i in range(3):
        shards.train_shard(make_experiment(config), sharded, i, 3, progress=False, log=messages.append)
    assert sum("program h2 is split over shards" in m for m in messages) == 2
    one, split = _comparable(_read(tmp_path / "one")), _comparable(_read(sharded))
    assert split["programs"] == one["programs"]
    for a, b in zip(one["members"], split["members"], strict=True):
        assert a.keys() == b.keys() and a["program"] == b["program"]
        for key, value in a.items():
            if a["program"] == "h2" and isinstance(value, (float, list)):  # loss_curve: a list of floats
                assert b[key] == pytest.approx(value, rel=1e-5, abs=1e-5), (a["name"], key)
            else:
                assert b[key] == value, (a["name"], key)
