"""Bad checkpoints, analysis inputs and device counts through the CLI: exit status 2, one line on
stderr naming the file or option, nothing unpickled, the workdir left as it was."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from mhjax import cli
from tests.errors_common import ROOT, assert_one_line_error, snapshot


def _checkpoint_files(workdir, step):
    root = os.path.join(workdir, "checkpoints", str(step))
    return sorted(os.path.join(r, f) for r, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("damage", ["truncate-data", "truncate-all", "garbage-metadata", "delete-data"])
def test_corrupt_checkpoint_is_one_line_naming_the_file(workdir_copy, capsys, damage):
    config, workdir, _ = workdir_copy
    files = _checkpoint_files(workdir, 2)
    data = [f for f in files if os.sep + "d" + os.sep in f and os.path.getsize(f) > 0]
    assert data, files
    if damage == "truncate-data":
        for f in data:
            with open(f, "r+b") as fh:
                fh.truncate(os.path.getsize(f) // 2)
    elif damage == "truncate-all":
        for f in files:
            with open(f, "r+b") as fh:
                fh.truncate(os.path.getsize(f) // 3)
    elif damage == "garbage-metadata":
        for f in files:
            if os.path.basename(f) in ("_METADATA", "manifest.ocdbt", "_CHECKPOINT_METADATA"):
                with open(f, "wb") as fh:
                    fh.write(b"\x00garbage{")
    else:
        for f in data:
            os.remove(f)
    before = snapshot(workdir)
    code = cli.main(["train", "--config", config, "--workdir", workdir, "--no-progress"])
    line = assert_one_line_error(capsys, code, "checkpoint")
    assert os.path.join(workdir, "checkpoints") in line
    assert snapshot(workdir) == before


def _retarget(workdir, config_dict_edit):
    """Edit the workdir's stored config as if it had been trained with another one."""
    meta_path = os.path.join(workdir, "mhjax.json")
    meta = json.load(open(meta_path))
    config_dict_edit(meta["config"])
    with open(meta_path, "w") as f:
        json.dump(meta, f)


@pytest.mark.parametrize("change", ["width", "mlp_dim", "heads", "layers"])
def test_mismatched_checkpoint_names_file_and_mismatch(workdir_copy, capsys, change):
    config, workdir, _ = workdir_copy
    override = {
        "width": ("model", "width", 32),
        "mlp_dim": ("model", "mlp_dim", 64),
        "heads": ("sweep", "heads", [4]),
        "layers": ("model", "num_layers", 2),
    }[change]
    section, field, value = override

    def edit(c):
        c[section][field] = value

    _retarget(workdir, edit)
    before = snapshot(workdir)
    text = str(tuple(value)) if isinstance(value, list) else str(value)
    code = cli.main(
        ["train", "--config", config, "--workdir", workdir, "--no-progress", f"--config.{section}.{field}={text}"]
    )
    line = assert_one_line_error(capsys, code, "does not match this sweep")
    assert os.path.join(workdir, "checkpoints", "2") in line
    expected = {
        "width": r"members\.copy-h2-s0\.\S+ has shape \(16,?.*\) in the checkpoint, this config needs \(32",
        "mlp_dim": r"mlp\S* has shape .*32.* this config needs .*64",
        "heads": r"holds members copy-h2-s0 but this sweep has copy-h4-s0",
        "layers": r"block_1\S* is not in the checkpoint",
    }[change]
    assert re.search(expected, line), line
    assert snapshot(workdir) == before


def test_analyze_bad_inputs(trained, tmp_path, capsys):
    _, workdir = trained
    junk = tmp_path / "4_heads_copy.pt"
    junk.write_bytes(b"PK\x03\x04 this is not a zip")
    npy_junk = tmp_path / "junk.npy"
    npy_junk.write_bytes(b"nope")
    floats = tmp_path / "floats.npy"
    np.save(floats, np.zeros((2, 8), np.float32))
    out = str(tmp_path / "out")
    before = snapshot(workdir)
    cases = [
        (
            [
                "analyze",
                "--torch-checkpoint",
                str(tmp_path / "missing.pt"),
                "--heads",
                "4",
                "--task",
                "copy",
                "--out",
                out,
            ],
            "--torch-checkpoint",
        ),
        (["analyze", "--torch-checkpoint", str(junk), "--heads", "4", "--task", "copy", "--out", out], str(junk)),
        (["analyze", "--torch-checkpoint", str(junk), "--task", "copy", "--out", out], "--heads"),
        (["analyze", "--torch-checkpoint", str(junk), "--heads", "four", "--task", "copy", "--out", out], "--heads"),
        (["analyze"], "exactly one"),
        (["analyze", "--workdir", str(tmp_path / "nowhere")], "--workdir"),
        (["analyze", "--workdir", str(tmp_path)], "--workdir"),
        (["analyze", "--workdir", workdir, "--sequences", str(tmp_path / "missing.npy"), "--out", out], "--sequences"),
        (["analyze", "--workdir", workdir, "--sequences", str(npy_junk), "--out", out], "--sequences"),
        (["analyze", "--workdir", workdir, "--sequences", str(floats), "--out", out], "--sequences"),
        (["analyze", "--workdir", workdir, "--heads", "2", "--out", out], "--heads"),
        (["analyze", "--workdir", workdir, "--batch-size", "0", "--out", out], "--batch-size"),
    ]
    for argv, match in cases:
        assert_one_line_error(capsys, cli.main(argv), match)
    assert snapshot(workdir) == before


def test_device_count_beyond_the_mesh_is_refused(trained, capsys):
    config, workdir = trained
    from mhjax.config import load_config_file

    paper = load_config_file(os.path.join(ROOT, "configs", "paper.py"))
    if "devices" not in paper:
        pytest.skip("config.devices not implemented yet")
    import jax

    before = snapshot(workdir)
    for value, match in (
        (str(jax.local_device_count() + 1), "config.devices"),
        ("-1", "config.devices"),
        ("two", "config.devices"),
    ):
        code = cli.main(["train", "--config", config, "--workdir", workdir, f"--config.devices={value}"])
        assert_one_line_error(capsys, code, match)
    assert snapshot(workdir) == before


# ---- a few through a real subprocess: the real stderr holds one line, no traceback ----


def _cli_subprocess(*argv):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run(
        [sys.executable, "-m", "mhjax", *argv], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT
    )


def test_subprocess_errors_are_one_line(workdir_copy, tmp_path):
    config, workdir, _ = workdir_copy
    data = [f for f in _checkpoint_files(workdir, 2) if os.sep + "d" + os.sep in f and os.path.getsize(f) > 0]
    for f in data:
        with open(f, "r+b") as fh:
            fh.truncate(os.path.getsize(f) // 2)
    before = snapshot(workdir)
    broken = tmp_path / "broken.py"
    broken.write_text("def get_config():\n    raise RuntimeError('boom')\n")
    cases = [
        (["train", "--config", config, "--workdir", workdir, "--config.sweep.heads=(3,)"], "config.sweep.heads"),
        (["train", "--config", config, "--workdir", workdir, "--config.train.steps=abc"], "config.train.steps"),
        (["train", "--config", str(broken), "--workdir", workdir], "--config"),
        (["train", "--config", config, "--workdir", workdir, "--no-progress"], "checkpoint"),  # corrupt checkpoint
    ]
    for argv, match in cases:
        proc = _cli_subprocess(*argv)
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and len(proc.stderr.splitlines()) == 1, proc.stderr[-2000:]
        assert proc.stderr.startswith("mhjax: error: ") and match in proc.stderr and proc.stdout == ""
    assert snapshot(workdir) == before


# ---- untrusted files: restoring a checkpoint never runs code from disk ----


class _Payload:
    """Unpickling this creates the marker file (what a hostile pickle would do)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_checkpoint_restore_never_unpickles(workdir_copy, tmp_path, capsys):
    """orbax StandardRestore reads JSON metadata and tensorstore (zarr/OCDBT) arrays only: pickle
    files planted in a checkpoint are ignored, and metadata replaced by a pickle is an error."""
    import pickle

    config, workdir, _ = workdir_copy
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Payload(str(marker)), protocol=2)
    step = os.path.join(workdir, "checkpoints", "2")
    planted = [
        "checkpoint",
        "checkpoint.pkl",
        "_CHECKPOINT_METADATA.pkl",
        "default/data.pkl",
        "default/pytree.pkl",
        "default/_METADATA.pkl",
        "default/checkpoint.msgpack",
    ]
    for name in planted:
        with open(os.path.join(step, name), "wb") as f:
            f.write(evil)
    # Training is complete: this restores the checkpoint, evaluates and rewrites the results.
    assert cli.main(["train", "--config", config, "--workdir", workdir, "--no-progress"]) == 0
    assert "not retraining" in capsys.readouterr().err
    assert not marker.exists()
    # default/checkpoint is orbax's legacy msgpack file name: read as msgpack (data, never code).
    for name in ("_CHECKPOINT_METADATA", "default/_METADATA", "default/manifest.ocdbt", "default/checkpoint"):
        with open(os.path.join(step, name), "wb") as f:
            f.write(evil)
    code = cli.main(["train", "--config", config, "--workdir", workdir, "--no-progress"])
    assert step in assert_one_line_error(capsys, code, "checkpoint")
    assert not marker.exists()


def test_the_package_has_no_unsafe_loaders():
    """No pickle/dill/torch.load/np.load(allow_pickle=True) anywhere in mhjax: the only
    unpickler is torch_import's allow-list one (tested in tests/test_torch_import.py)."""
    import ast

    package = os.path.join(ROOT, "mhjax")
    problems = []
    for root, _, files in os.walk(package):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(root, name)
            tree = ast.parse(open(path).read(), path)
            for node in ast.walk(tree):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                    for m in modules:
                        if m.split(".")[0] in (
                            "pickle",
                            "dill",
                            "cloudpickle",
                            "joblib",
                            "shelve",
                            "marshal",
                        ) and not path.endswith("torch_import.py"):
                            problems.append(f"{path}:{node.lineno} imports {m}")
                if isinstance(node, ast.Call):
                    func = ast.unparse(node.func)
                    if func in ("torch.load", "pickle.load", "pickle.loads", "eval", "exec") or func.endswith(
                        "PyTreeCheckpointHandler"
                    ):
                        problems.append(f"{path}:{node.lineno} calls {func}")
                    for kw in node.keywords:
                        if kw.arg == "allow_pickle" and not (
                            isinstance(kw.value, ast.Constant) and kw.value.value is False
                        ):
                            problems.append(f"{path}:{node.lineno} {func}(allow_pickle=...)")
    assert not problems, problems
