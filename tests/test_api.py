"""The Python API: README's notebook section runs as written; bad input raises ConfigError."""

import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

import mhjax

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def notebook_code() -> str:
    """The first ```python block of README's "From a notebook" section."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = text.split("## From a notebook", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def readme_examples(title: str) -> str:
    """The first ```python block of README's section ``title`` (## or ###)."""
    text = open(os.path.join(ROOT, "README.md")).read()
    section = re.split(rf"#+ {re.escape(title)}\n", text, maxsplit=1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.slow  # 35-50 s each on 2 CPU cores; tests/test_forward.py and test_mixture_plugins.py cover the same calls
@pytest.mark.parametrize("title", ["Inside a trained member", "Your own mixture data, model and loss"])
def test_the_readme_forward_and_mixture_examples_run_as_written(title, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    scope = {}
    exec(compile(readme_examples(title), "README.md", "exec"), scope)
    out = capsys.readouterr().out
    if "tokens" in scope:
        assert "(8, 4, 32, 32) (8, 32, 4, 16)" in out and scope["out"].accuracy_by_position.shape == (32,)
        effect = scope["effect"]  # the per-head patching sweep: every head patched once, some matter
        assert effect.shape == (4, 4) and np.isfinite(effect).all() and np.abs(effect).max() > 0
    else:  # the NTK margin rebuilt from the run's own data equals the recorded one
        for line in out.strip().splitlines():
            name, status, _, recorded, rebuilt = line.split()
            assert status == "ok" and float(rebuilt) == pytest.approx(float(recorded), rel=1e-3), line


def test_the_readme_notebook_section_runs_as_written(tmp_path, monkeypatch, capsys):
    shutil.copytree(os.path.join(ROOT, "examples"), tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delitem(sys.modules, "my_task", raising=False)
    scope = {}
    exec(compile(notebook_code(), "README.md", "exec"), scope)
    out = capsys.readouterr().out
    assert "['first_token-h1-s0', 'first_token-h4-s0']\nNone\n" in out
    run = scope["run"]
    assert isinstance(run, mhjax.Run) and len(scope["steps"]) == len(scope["accuracy"]) > 0
    assert scope["steps"][-1] == 20 and scope["accuracy"][-1] == run.results[1]["eval_accuracy"]
    assert "block_0" in scope["params"]
    assert list(scope["table"]["name"]) == run.member_names
    assert run.analysis["members"]["first_token-h1-s0"]["task"] == "first_token"
    # Resumable: the same call again trains nothing and reads the same results.
    again = mhjax.sweep(scope["config"], "runs/notebook", progress=False)
    drop = lambda members: [
        {k: v for k, v in m.items() if k not in ("program_wall_time_s", "wall_time_s")} for m in members
    ]  # noqa: E731
    assert drop(again.results) == drop(run.results)  # wall times come back from the checkpoint as float32


def test_bad_input_raises_config_error_with_the_command_line_message(tmp_path):
    with pytest.raises(mhjax.ConfigError, match=r"^config.sweep.heads: each must divide model.width=64"):
        mhjax.load_config("quick", {"sweep.heads": (3,)})
    with pytest.raises(
        mhjax.ConfigError, match=r"^config.trian.steps: unknown field \(known here: attention, compare, data, "
    ):
        mhjax.load_config("quick", {"trian.steps": 3})
    with pytest.raises(mhjax.ConfigError, match="^config: file not found: nope.py"):
        mhjax.sweep("nope.py", tmp_path / "w")
    with pytest.raises(mhjax.ConfigError, match="has no mhjax.json"):
        mhjax.load(tmp_path)
    config = mhjax.load_config("quick", {"train.steps": 7, "sweep.task": ("recall",)})
    assert config.train.steps == 7 and tuple(config.sweep.task) == ("recall",)


def test_readme_and_docs_cite_only_paths_of_the_repository_and_show_a_real_task():
    """README stays within 250 lines; every repository path README and docs/*.md cite exists; the
    own-task section's code is examples/my_task.py's (a task with a targets(tokens) form)."""
    import glob

    readme = open(os.path.join(ROOT, "README.md")).read()
    assert readme.count("\n") <= 250
    top = ("mhjax/", "configs/", "docs/", "examples/", "benchmarks/", "launch/", "tests/", "shared/", ".ci/")
    for page in ["README.md", *sorted(glob.glob(os.path.join(ROOT, "docs", "*.md")))]:
        text = open(os.path.join(ROOT, page)).read()
        cited = re.findall(r"`((?:[\w.-]+/)+[\w.*-]*)`|\]\(([^)#:]+)\)", text)
        for path in (a or b for a, b in cited):
            here = os.path.join(os.path.dirname(os.path.join(ROOT, page)), path)
            if path.startswith(top) or os.path.exists(here):
                assert glob.glob(os.path.join(ROOT, path)) or os.path.exists(here), f"{page} cites {path}"
    code = readme_examples("Your own task")
    assert "targets=previous" in code
    example = open(os.path.join(ROOT, "examples", "my_task.py")).read()
    assert all(line.split("  #")[0].rstrip() in example for line in code.splitlines())


def test_import_mhjax_does_not_import_jax():
    code = "import sys, mhjax; print('jax' in sys.modules, mhjax.__version__)"
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": ROOT}, capture_output=True)
    assert done.stdout.decode().split() == ["False", mhjax.__version__]


def test_one_load_config_for_the_command_line_and_the_api(tmp_path, monkeypatch, capsys):
    """workflows/configs.py: a bundled name resolves on the command line too; where no checkout's
    configs/ exists (an installed package), the error says that names resolve in a checkout only."""
    from mhjax import cli
    from mhjax.workflows import configs

    assert cli.main(["train", "--config", "quick", "--config.sweep.heads=(1,)", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("experiment: sequence, ")
    by_name, by_path = mhjax.load_config("quick"), mhjax.load_config(os.path.join(ROOT, "configs", "quick.py"))
    assert by_name.to_dict() == by_path.to_dict()
    monkeypatch.setattr(configs, "CONFIG_DIR", str(tmp_path / "no-configs"))
    with pytest.raises(mhjax.ConfigError) as exc:
        mhjax.load_config("quick")
    assert str(exc.value) == "config: file not found: quick (bundled names resolve in a checkout only)"  # Python names
