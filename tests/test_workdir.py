"""mhjax/io/workdir.py: the one owner of a workdir's file names and readers. Nothing else in the
package names those files; every missing or unreadable file is a one-line error naming it; a
command reads each file once; a workdir's checkpoint reads without model code."""

import ast
import builtins
import json
import os
import re
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest

from mhjax import cli
from mhjax.config import ConfigError
from mhjax.io import curves as curves_module
from mhjax.io.workdir import ANALYSIS_FILES, Workdir
from tests.errors_common import assert_one_line_error

PACKAGE = Path(__file__).resolve().parents[1] / "mhjax"
NAMES = sorted(
    {
        Workdir.METADATA,
        Workdir.LOCK,
        Workdir.LOG,
        Workdir.CHECKPOINTS,
        Workdir.SNAPSHOTS,
        Workdir.TENSORBOARD,
        Workdir.RESULTS,
        Workdir.RESULTS_TABLE,
        Workdir.REPORT,
        *ANALYSIS_FILES.values(),
    }
)
# A dotted name anywhere; a plain word (checkpoints, tb) as a whole string or next to a "/"
WORD = re.compile(
    "|".join(
        rf"(?<![\w.]){re.escape(n)}(?![\w])" if "." in n else rf"^{n}$|(?<=/){n}(?![\w])|(?<![\w.]){n}(?=/)"
        for n in NAMES
    )
)


def _documentation(tree) -> set[int]:
    """ids of the string constants that document rather than do: docstrings, argparse help and
    descriptions (they may mention a file a user will see)."""
    ids = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant):
                ids.add(id(body[0].value))
        if isinstance(node, ast.keyword) and node.arg in ("help", "description"):
            ids.update(id(n) for n in ast.walk(node.value))
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "").endswith("DESCRIPTION") for t in node.targets):
            ids.update(id(n) for n in ast.walk(node.value))
    return ids


def file_names_in(source: str) -> list[str]:
    """The workdir file names that string constants of ``source`` spell out (documentation aside)."""
    tree = ast.parse(source)
    documentation = _documentation(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in documentation:
            found += [f"{node.lineno}:{m.group(0)}" for m in WORD.finditer(node.value)]
    return found


def test_the_checker_finds_literal_names():
    assert file_names_in('p = os.path.join(w, "results.json")') == ["1:results.json"]
    assert sorted(file_names_in('p = f"{w}/tb/{name}"\nq = "checkpoints"')) == ["1:tb", "2:checkpoints"]
    assert file_names_in('def f():\n    """Reads W/mhjax.json."""\n    return 1') == []
    assert file_names_in('print("the results are in", "released checkpoints have no tb")') == []


def test_no_module_but_workdir_names_a_workdir_file():
    offenders = [
        f"{path.relative_to(PACKAGE.parent)}:{hit}"
        for path in PACKAGE.rglob("*.py")
        if path != PACKAGE / "io" / "workdir.py"
        for hit in file_names_in(path.read_text())
    ]
    assert offenders == []


def test_missing_or_unreadable_files_are_one_line_errors_naming_them(tmp_path):
    wd = Workdir(tmp_path)
    for read, name in ((wd.results, "results.json"), (wd.metadata, "mhjax.json"), (wd.analysis, "analysis.json")):
        with pytest.raises(ConfigError, match=re.escape(name)):
            read()
    (tmp_path / "mhjax.json").write_text('{"config": ')
    (tmp_path / "results.json").write_text("[1, 2]")
    os.makedirs(tmp_path / "analysis")
    (tmp_path / "analysis" / "analysis.json").write_text("\xff garbage")
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path / "mhjax.json")) + " is unreadable"):
        wd.metadata()
    with pytest.raises(ConfigError, match="results.json is not a JSON object"):
        wd.results()
    assert wd.has_analysis()
    with pytest.raises(ConfigError, match="analysis.json is unreadable"):  # never a silent "no analysis"
        wd.analysis()
    with pytest.raises(ConfigError, match=re.escape(os.path.join(str(tmp_path), "tb", "m"))):
        wd.curves("m")
    (tmp_path / "mhjax.json").write_text(json.dumps({"config": {"model": {"seq_len": 8}}}))
    fresh = Workdir(tmp_path)
    assert fresh.config_field("model.seq_len") == 8
    with pytest.raises(ConfigError, match=r"mhjax.json has no config.sweep"):
        fresh.sweep_fields()
    with pytest.raises(ConfigError, match="no such directory"):
        Workdir(tmp_path / "missing").results()
    for error in ConfigError, ValueError:
        assert "\n" not in str(error("x"))


def test_report_with_a_broken_metadata_file_names_it(trained, tmp_path, capsys):
    """report used to fall back to no swept fields; reproduction to the paper's sizes."""
    _, workdir = trained
    copy = tmp_path / "w"
    shutil.copytree(workdir, copy)
    (copy / "mhjax.json").write_text("{")
    line = assert_one_line_error(capsys, cli.main(["report", "--workdir", str(copy)]), "unreadable")
    assert str(copy / "mhjax.json") in line


def test_a_report_reads_each_file_once(trained, tmp_path, monkeypatch):
    from mhjax.workflows.report import write_report

    _, workdir = trained
    copy = tmp_path / "w"
    shutil.copytree(workdir, copy)
    opened, runs = {}, {}
    real_open, real_read_run = builtins.open, curves_module.read_run

    def counting_open(path, *args, **kwargs):
        if str(path).startswith(str(copy)) and not (args and "w" in args[0]) and "w" not in kwargs.get("mode", "r"):
            opened[str(path)] = opened.get(str(path), 0) + 1
        return real_open(path, *args, **kwargs)

    def counting_read_run(path):
        runs[path] = runs.get(path, 0) + 1
        return real_read_run(path)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(curves_module, "read_run", counting_read_run)
    wd = Workdir(copy)
    write_report(wd)
    # results.json holds the paired table's comparisons (analysis/comparisons.py): no window file is read
    assert opened == {wd.results_path: 1, wd.metadata_path: 1}
    assert runs == {wd.run_dir(name): 1 for name in wd.member_names()}


def test_params_of_the_latest_checkpoint_read_without_model_code(trained):
    from mhjax.experiments import make_experiment
    from mhjax.train.loop import Sweep

    config, workdir = trained
    wd = Workdir(workdir)
    assert wd.latest_step() == 2 and wd.member_names() == ["copy-h2-s0"]
    import ml_collections

    sweep = Sweep(make_experiment(ml_collections.ConfigDict(wd.config())))
    checkpointer = wd.checkpointer()
    try:
        states, _ = sweep.restore(checkpointer, 2)
    finally:
        checkpointer.close()
    expected = sweep.member_states(states)["copy-h2-s0"].params
    got = wd.params("copy-h2-s0")
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(expected)
    for a, b in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(expected)):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ConfigError, match="no member 'nobody'"):
        wd.params("nobody")
    assert "train/loss" in wd.curves("copy-h2-s0") and wd.curves("copy-h2-s0", ["nope"]) == {}


def test_a_held_workdir_reads_a_file_again_once_it_changed(trained, tmp_path):
    """A Run kept in a notebook while its sweep goes on: results, TensorBoard curves and the
    latest checkpoint are read again once they change on disk, and only then."""
    from tensorboardX import SummaryWriter

    import mhjax

    _, workdir = trained
    copy = tmp_path / "w"
    shutil.copytree(workdir, copy)
    run = mhjax.load(copy)
    wd = run._files
    name = run.member_names[0]
    steps, _ = run.curves(name)["train/loss"]
    assert run.results[0]["steps"] == 2 and wd.latest_step() == 2

    results = json.loads((copy / "results.json").read_text())
    results["members"][0]["steps"] = 4
    (copy / "results.json.new").write_text(json.dumps(results))
    os.replace(copy / "results.json.new", copy / "results.json")  # as write_json replaces it
    writer = SummaryWriter(wd.run_dir(name))
    writer.add_scalar("train/loss", 0.5, 99)
    writer.close()
    shutil.copytree(copy / "checkpoints" / "2", copy / "checkpoints" / "4")

    assert run.results[0]["steps"] == 4
    new_steps, values = run.curves(name)["train/loss"]
    assert list(new_steps) == [*steps, 99] and values[-1] == 0.5
    assert wd.latest_step() == 4


def test_a_report_goes_on_without_a_members_tensorboard_run(trained, tmp_path):
    """A member whose TensorBoard writer could not open its folder (io/tensorboard.py goes on
    without it) has no curves in the report; the report is still written."""
    from mhjax.workflows.report import write_report

    _, workdir = trained
    copy = tmp_path / "w"
    shutil.copytree(workdir, copy)
    wd = Workdir(copy)
    name = wd.member_names()[0]
    shutil.rmtree(wd.run_dir(name))
    assert wd.has_curves() and not wd.has_curves(name)
    assert os.path.isfile(write_report(wd)["md"])


def test_an_opened_workdir_reads_results_curves_and_params_without_its_task_code(trained, tmp_path):
    """workflows/workdir.py: a plug-in task's source gone, mhjax.load and every reader still work;
    only what needs the task (the experiment, analyze) names it, in one line."""
    import mhjax
    from mhjax.data import tasks
    from mhjax.workflows.workdir import open_workdir

    _, workdir = trained
    copy = tmp_path / "w"
    shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns(Workdir.LOCK))
    meta = json.loads((copy / Workdir.METADATA).read_text())
    gone = str(tmp_path / "gone_task.py")
    meta["tasks"] = {"gone_task": {"module": "gone_task_module", "function": "f", "file": gone}}
    (copy / Workdir.METADATA).write_text(json.dumps(meta))
    run = mhjax.load(copy)
    assert run.member_names == ["copy-h2-s0"] and run.results[0]["task"] == "copy"
    assert run.config.model.width == meta["config"]["model"]["width"] and run.analysis is None
    assert jax.tree_util.tree_leaves(run.params("copy-h2-s0")) and "train/loss" in run.curves("copy-h2-s0")
    message = f"task 'gone_task': its module gone_task_module ({gone}, recorded in {copy / Workdir.METADATA}) is gone; "
    with pytest.raises(ConfigError) as exc:  # the command line's words: no run.analyze() it cannot call
        open_workdir(copy).experiment()
    assert str(exc.value) == message + tasks.HOW_TO_REGISTER["cli"]
    assert "put its source back" in str(exc.value)
    with pytest.raises(ConfigError) as exc:
        run.analyze(num_sequences=2, plot=False, tensorboard=False)
    assert str(exc.value) == message + "register it in Python first (import or run the code that defines it)"
    with pytest.raises(ConfigError, match="has no mhjax.json"):
        _ = open_workdir(tmp_path).config
