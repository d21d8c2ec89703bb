"""Every `mhjax` command through the real entry point (mhjax.cli.main, and `python -m mhjax` once) with
minimal arguments: its exit status and the files it writes. A command whose signature or wiring drifts
fails here; a new command fails test_every_command_is_run_here until a test below runs it."""

import contextlib
import io
import json
import os
import subprocess
import sys

import pytest

from mhjax import cli
from tests.conftest import config_source, tiny_sequence_config, tiny_train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CKPT_DIR = os.path.join(os.path.dirname(ROOT), "shared", "reference", "beyond_parallelism", "checkpoints")
MEMBERS = ("copy-h1-s0", "copy-h2-s0")
RUN = set()  # the commands the tests below run


def runs(command: str):
    RUN.add(command)
    return lambda test: test


def main(argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of mhjax.cli.main(argv)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(argv)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """`mhjax train` of two members (1 and 2 heads) for 2 steps: (exit status, stdout, stderr, workdir)."""
    base = tmp_path_factory.mktemp("entry")
    config = base / "tiny.py"
    config.write_text(config_source(tiny_train(tiny_sequence_config(heads=(1, 2)), 2, 2, 2, 2)))
    workdir = str(base / "w")
    return (*main(["train", "--config", str(config), "--workdir", workdir, "--no-progress"]), workdir)


def test_every_command_is_run_here():
    parser = cli._parser()
    (subparsers,) = [a for a in parser._actions if a.dest == "command"]
    assert RUN == set(cli.COMMANDS) == set(subparsers.choices)


@runs("train")
def test_train(trained):
    code, out, err, workdir = trained
    assert code == 0, err
    assert "results.json" in out
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    assert [m["name"] for m in results["members"]] == list(MEMBERS)
    assert all(m["steps"] == 2 and m["status"] == "ok" for m in results["members"])
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "2"))
    assert sorted(os.listdir(os.path.join(workdir, "tb"))) == list(MEMBERS)


@runs("status")
def test_status(trained):
    """A finished sweep: every member done at its last step; results.json keeps its own status (ok)."""
    workdir = trained[-1]
    code, out, err = main(["status", "--workdir", workdir, "--json"])
    assert code == 0, err
    status = json.loads(out)
    assert [(r["name"], r["state"], r["step"], r["eta_s"]) for r in status["members"]] == [
        (name, "done", 2, 0.0) for name in MEMBERS
    ]
    with open(os.path.join(workdir, "results.json")) as f:
        assert {m["status"] for m in json.load(f)["members"]} == {"ok"}


@runs("analyze")
def test_analyze_workdir(trained):
    workdir = trained[-1]
    code, out, err = main(["analyze", "--workdir", workdir, "--num-sequences", "4", "--seed", "3"])
    assert code == 0, err
    for name in ("analysis.json", "analysis.md", "analysis.png"):
        assert os.path.getsize(os.path.join(workdir, "analysis", name)) > 0, name
    for member in MEMBERS:  # each member's accuracy once, on sequences the output names
        assert (out + err).count(member) == 1, out + err
    assert "on 4 random sequences of length 8 (--seed 3)" in out
    assert "held-out set, 8 sequences per task and seed" in out  # train's eval_accuracy: data.num_eval = 8


@runs("analyze")
@pytest.mark.skipif(not os.path.isfile(os.path.join(CKPT_DIR, "1_heads_copy.pt")), reason=f"no {CKPT_DIR}")
def test_analyze_released_checkpoint(tmp_path):
    path = os.path.join(CKPT_DIR, "1_heads_copy.pt")
    code, out, err = main(
        ["analyze", "--torch-checkpoint", path, "--heads", "1", "--task", "copy", "--out", str(tmp_path)]
        + ["--num-sequences", "2"]
    )
    assert code == 0, err
    assert out.count("1_heads_copy.pt: 1 head, copy, accuracy") == 1
    assert "on 2 random sequences of length 100 (--seed 0)" in out
    for name in ("analysis.json", "analysis.md", "analysis.png"):
        assert os.path.getsize(tmp_path / name) > 0, name


@runs("sample")
def test_sample(trained):
    workdir = trained[-1]
    argv = ["sample", "--workdir", workdir, "--member", "copy-h2-s0", "--prompt", "1 2 3", "--tokens", "3"]
    code, out, err = main([*argv, "--temperature", "0"])
    assert code == 0, err
    ids = [int(x) for x in out.split()]  # a synthetic task's member: token ids, the prompt's first
    assert ids[:3] == [1, 2, 3] and len(ids) == 6 and all(0 <= i < 16 for i in ids)
    assert "copy-h2-s0 at step 2: 3 tokens at temperature 0, top-k all, seed 0" in err


@runs("report")
def test_report(trained):
    workdir = trained[-1]
    code, out, err = main(["report", "--workdir", workdir])
    assert code == 0, err
    assert os.path.getsize(os.path.join(workdir, "report.md")) > 0
    for name in ("curves.png", "mixing_fidelity.png", "synergy.png"):  # analysed by the test above
        assert os.path.getsize(os.path.join(workdir, "report", name)) > 0, name


@runs("configs")
def test_configs_through_python_dash_m():
    env = {**os.environ, "PYTHONPATH": ROOT}
    done = subprocess.run(
        [sys.executable, "-m", "mhjax", "configs"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "configs/quick.py" in done.stdout and "configs/paper.py" in done.stdout


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`mhjax configs | head -1`: the pipe closes before mhjax writes; it stops quietly."""
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen(
        [sys.executable, "-m", "mhjax", "configs"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    proc.stdout.close()  # the reader leaves at once
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 1
    assert "Traceback" not in err and "BrokenPipe" not in err, err


@runs("example2")
def test_example2(tmp_path):
    code, out, err = main(["example2", "--out", str(tmp_path / "ex2")])
    assert code == 0, err
    with open(tmp_path / "ex2" / "example2.json") as f:
        result = json.load(f)
    assert result["combined_beats_both"] is True
    assert os.path.getsize(tmp_path / "ex2" / "example2.png") > 0
    assert "multi-head" in out
