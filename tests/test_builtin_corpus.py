"""data.path=builtin:stdlib (mhjax/data/python_corpora.py): the running Python's standard-library
sources as a byte corpus, selected by a fixed rule, in sorted order, cached by content under
$MHJAX_CACHE_DIR and recorded (Python, sha256); an unknown name refused in one line; and
configs/text_heads.py, which reads it, dry-runs on a machine with an empty cache."""

import hashlib
import os
import platform
import sysconfig

import pytest

from mhjax import cli
from mhjax.data import python_corpora, tasks, text
from tests.errors_common import ROOT, assert_one_line_error


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty corpus folder (the rest of mhjax's cache, its compiled kernel, kept) and no corpus
    built or loaded in this process yet."""
    monkeypatch.setattr(python_corpora, "corpus_dir", lambda: str(tmp_path / "cache" / "corpora"))
    saved = [dict(m) for m in (python_corpora._BUILT, text._LOADED, text._BOUND)]
    for m in (python_corpora._BUILT, text._LOADED, text._BOUND):
        m.clear()
    yield tmp_path / "cache"
    for m, before in zip((python_corpora._BUILT, text._LOADED, text._BOUND), saved):
        m.clear()
        m.update(before)


def test_built_in_corpora_live_in_the_mhjax_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MHJAX_CACHE_DIR", str(tmp_path))
    assert python_corpora.corpus_dir() == str(tmp_path / "corpora")


def test_the_selection_rule_takes_py_files_in_sorted_order_skipping_tests_and_packages(tmp_path):
    files = {
        "b.py": b"B",
        "a/z.py": b"AZ",
        "a/b.py": b"AB",
        "a_b.py": b"A_B",  # "a/..." sorts before "a_b.py" ("/" < "_")
        "a/tests/t.py": b"x",
        "test/t.py": b"x",
        "idlelib/idle_test/t.py": b"x",
        "idlelib/run.py": b"IR",
        "site-packages/numpy/n.py": b"x",
        "__pycache__/c.py": b"x",
        "notes.txt": b"x",
        "c.pyc": b"x",
    }
    for rel, data in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    assert python_corpora.stdlib_files(str(tmp_path)) == ["a/b.py", "a/z.py", "a_b.py", "b.py", "idlelib/run.py"]
    data, about = python_corpora.stdlib_sources(str(tmp_path))
    assert data == b"ABAZA_BBIR"
    assert about["files"] == 5 and about["python"] == platform.python_version() and about["builtin"] == "stdlib"


def _stdlib_sha256_by_hand() -> tuple[str, int]:
    """The rule of the docs (docs/text_heads.md), apart from the module's code."""
    root = sysconfig.get_paths()["stdlib"]
    skip = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}
    paths = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in skip]
        paths += [
            os.path.relpath(os.path.join(folder, n), root).replace(os.sep, "/") for n in names if n.endswith(".py")
        ]
    digest = hashlib.sha256()
    for rel in sorted(paths):
        with open(os.path.join(root, rel), "rb") as f:
            digest.update(f.read())
    return digest.hexdigest(), len(paths)


def test_builtin_stdlib_is_built_once_into_the_cache_with_the_same_sha256_every_time(fresh_cache):
    want, count = _stdlib_sha256_by_hand()
    corpus = text.load("builtin:stdlib")
    assert corpus.sha256 == want and corpus.encoding == "bytes"
    assert os.path.dirname(corpus.path) == str(fresh_cache / "corpora")
    with open(corpus.path, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == want
    record = corpus.record
    assert record["sha256"] == want and record["builtin"] == "stdlib" and record["files"] == count
    assert record["python"] == platform.python_version()
    mtime = os.stat(corpus.path).st_mtime_ns
    python_corpora._BUILT.clear()  # built again from the files: the same bytes, the file kept
    path, about = python_corpora.resolve("builtin:stdlib")
    assert (
        path == corpus.path
        and os.stat(path).st_mtime_ns == mtime
        and about == {k: v for k, v in record.items() if k not in ("path", "size", "sha256", "format")}
    )
    # results.json and mhjax.json: the bound task's facts and data record
    config = text_heads_config()
    task = text.bind(config)
    assert task.facts["corpus_sha256"] == want and task.facts["corpus_python"] == platform.python_version()
    assert task.source["data"] == record
    # analysis and forward: a built-in is checked against what this Python builds now
    source = {"data": dict(record)}
    assert tasks.changed_sources({"text": source}) == []
    source["data"]["sha256"] = "0" * 64  # as if trained on another Python's stdlib
    (line,) = tasks.changed_sources({"text": source})
    assert "its data file builtin:stdlib (Python" in line and "changed since training (sha256 differs)" in line


def text_heads_config():
    from mhjax.workflows.configs import load_config

    return load_config(os.path.join(ROOT, "configs", "text_heads.py"))


@pytest.mark.parametrize("name", ["builtin:nope", "builtin:", "builtin:Stdlib"])
def test_an_unknown_builtin_corpus_is_one_line_naming_the_allowed_ones(tmp_path, capsys, name):
    config = os.path.join(ROOT, "configs", "text_heads.py")
    argv = ["train", "--config", config, "--workdir", str(tmp_path / "w"), f"--config.data.path={name}"]
    line = assert_one_line_error(capsys, cli.main(argv), "config.data.path: unknown built-in corpus")
    assert line.endswith(f"{name!r}; allowed: builtin:stdlib")
    assert not os.path.exists(tmp_path / "w")


def test_the_text_heads_config_dry_runs_on_a_machine_with_an_empty_cache(fresh_cache, tmp_path, capsys):
    config = os.path.join(ROOT, "configs", "text_heads.py")
    argv = ["train", "--config", config, "--workdir", str(tmp_path / "w"), "--dry-run"]  # as a user types it
    assert cli.main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "experiment: sequence, 12 members, 1500 steps each" in out
    for name in ("text-h1-s0", "text-h2-s1", "text-h4-s2", "text-h8-s2"):
        assert name in out
    assert [p.name.split("-")[0] for p in (fresh_cache / "corpora").iterdir()] == ["stdlib"]
