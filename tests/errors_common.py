"""Shared pieces of the bad-input tests: a tiny config file, a trained workdir, a snapshot of
a workdir (to show a refused command changed nothing) and the one-line error check."""

import os
import shutil

import pytest

from mhjax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = """
import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.experiment = "sequence"
    c.seed = 0
    c.strategy = "grouped"
    c.sweep = ml_collections.ConfigDict(dict(task=("copy",), heads=(2,), seed=(0,), learning_rate=(3e-3,)))
    c.model = ml_collections.ConfigDict(dict(width=16, num_layers=1, mlp_dim=32, vocab_size=16, seq_len=8, dropout=0.1))
    c.data = ml_collections.ConfigDict(dict(protocol="fixed", num_train=16, batch_size=4, num_eval=8))
    c.train = ml_collections.ConfigDict(dict(steps=2, chunk_steps=2, eval_every=0, checkpoint_every=2))
{extra}
    return c
"""


def write_config(path, extra: str = "") -> str:
    path.write_text(CONFIG.format(extra="\n".join("    " + line for line in extra.splitlines())))
    return str(path)


def snapshot(workdir) -> dict:
    """Every file and folder under workdir with its size and mtime."""
    out = {}
    for root, dirs, files in os.walk(workdir):
        for name in dirs + files:
            path = os.path.join(root, name)
            st = os.stat(path)
            out[os.path.relpath(path, workdir)] = (st.st_size if name in files else None, st.st_mtime_ns)
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished tiny run: (config path, workdir)."""
    base = tmp_path_factory.mktemp("validation")
    config = write_config(base / "tiny.py")
    workdir = str(base / "trained")
    assert cli.main(["train", "--config", config, "--workdir", workdir, "--no-progress"]) == 0
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "2"))
    return config, workdir


def assert_one_line_error(capsys, code, match):
    out = capsys.readouterr()
    assert code == 2, (code, out.err)
    lines = out.err.splitlines()
    assert len(lines) == 1, out.err
    assert lines[0].startswith("mhjax: error: ") and "Traceback" not in out.err
    assert match.lower() in lines[0].lower(), lines[0]
    return lines[0]


@pytest.fixture
def workdir_copy(trained, tmp_path):
    """A copy of the trained workdir (same file mtimes), and its snapshot."""
    config, workdir = trained
    copy = str(tmp_path / "w")
    shutil.copytree(workdir, copy)
    return config, copy, snapshot(copy)
