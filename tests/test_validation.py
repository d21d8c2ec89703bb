"""Bad configs and inputs through the CLI: exit status 2, exactly one line on stderr, no
traceback, nothing compiled, and an existing workdir left exactly as it was.

Most cases call mhjax.cli.main in-process (fast); a few run `python -m mhjax` in a
subprocess to show the real stderr stream holds that one line and nothing else.
"""
import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

from mhjax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

CONFIG = '''
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
'''


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


# (id, extra argv for `mhjax train --config tiny.py --workdir <trained copy>`, expected text in the error)
OVERRIDE_CASES = [
    ("heads-not-dividing", ["--config.sweep.heads=(3,)"], "config.sweep.heads"),
    ("heads-zero", ["--config.sweep.heads=(0,)"], "config.sweep.heads"),
    ("heads-negative", ["--config.sweep.heads=(-2,)"], "config.sweep.heads"),
    ("heads-float", ["--config.sweep.heads=(2.5,)"], "config.sweep.heads"),
    ("heads-string", ["--config.sweep.heads=two"], "config.sweep.heads"),
    ("heads-empty", ["--config.sweep.heads=()"], "config.sweep.heads"),
    ("heads-repeated", ["--config.sweep.heads=(2,2)"], "config.sweep"),
    ("task-unknown", ["--config.sweep.task=copyy"], "config.sweep.task"),
    ("lr-zero", ["--config.sweep.learning_rate=(0.0,)"], "config.sweep.learning_rate"),
    ("lr-negative", ["--config.sweep.learning_rate=(-1e-3,)"], "config.sweep.learning_rate"),
    ("lr-nan", ["--config.sweep.learning_rate=nan"], "config.sweep.learning_rate"),
    ("lr-string", ["--config.sweep.learning_rate=fast"], "config.sweep.learning_rate"),
    ("sweep-seed-negative", ["--config.sweep.seed=(-1,)"], "config.sweep.seed"),
    ("sweep-seed-overflow", ["--config.sweep.seed=(1099511627776,)"], "config.sweep.seed"),
    ("seed-negative", ["--config.seed=-1"], "config.seed"),
    ("seed-string", ["--config.seed=abc"], "config.seed"),
    ("steps-zero", ["--config.train.steps=0"], "config.train.steps"),
    ("steps-negative", ["--config.train.steps=-5"], "config.train.steps"),
    ("steps-malformed", ["--config.train.steps=abc"], "config.train.steps"),
    ("steps-float", ["--config.train.steps=2.5"], "config.train.steps"),
    ("steps-overflow", ["--config.train.steps=4294967296"], "config.train.steps"),
    ("steps-missing-value", ["--config.train.steps"], "config.train.steps"),
    ("chunk-zero", ["--config.train.chunk_steps=0"], "config.train.chunk_steps"),
    ("eval-every-negative", ["--config.train.eval_every=-1"], "config.train.eval_every"),
    ("checkpoint-every-negative", ["--config.train.checkpoint_every=-1"], "config.train.checkpoint_every"),
    ("batch-zero", ["--config.data.batch_size=0"], "config.data.batch_size"),
    ("num-train-below-batch", ["--config.data.num_train=2"], "config.data.num_train"),
    ("num-eval-zero", ["--config.data.num_eval=0"], "config.data.num_eval"),
    ("protocol-unknown", ["--config.data.protocol=online"], "config.data.protocol"),
    ("dropout-one", ["--config.model.dropout=1.0"], "config.model.dropout"),
    ("dropout-negative", ["--config.model.dropout=-0.1"], "config.model.dropout"),
    ("width-zero", ["--config.model.width=0"], "config.model.width"),
    ("width-string", ["--config.model.width=wide"], "config.model.width"),
    ("layers-zero", ["--config.model.num_layers=0"], "config.model.num_layers"),
    ("vocab-zero", ["--config.model.vocab_size=0"], "config.model.vocab_size"),
    ("seq-len-negative", ["--config.model.seq_len=-8"], "config.model.seq_len"),
    ("strategy-unknown", ["--config.strategy=fastest"], "config.strategy"),
    ("experiment-unknown", ["--config.experiment=vision"], "config.experiment"),
    ("unknown-field", ["--config.model.widht=16"], "config.model.widht"),
    ("unknown-section", ["--config.optimizer.lr=1"], "config.optimizer.lr"),
    ("other-config-in-workdir", ["--config.train.steps=3"], "another config"),
    ("unknown-option", ["--bogus"], "unrecognized arguments"),
]


@pytest.fixture
def workdir_copy(trained, tmp_path):
    """A copy of the trained workdir (same file mtimes), and its snapshot."""
    config, workdir = trained
    copy = str(tmp_path / "w")
    shutil.copytree(workdir, copy)
    return config, copy, snapshot(copy)


@pytest.mark.parametrize("case,argv,match", OVERRIDE_CASES, ids=[c[0] for c in OVERRIDE_CASES])
def test_bad_override_is_one_line_and_leaves_workdir_untouched(trained, capsys, case, argv, match):
    config, workdir = trained
    before = snapshot(workdir)
    code = cli.main(["train", "--config", config, "--workdir", workdir, "--no-progress", *argv])
    line = assert_one_line_error(capsys, code, match)
    if case != "other-config-in-workdir":  # refused by validation, not by the workdir check
        assert "another config" not in line
    assert snapshot(workdir) == before


# (id, text added to get_config before `return c`, expected text)
FILE_CASES = [
    ("unknown-sweep-field", "c.sweep.optimizer = ('adam',)", "config.sweep.optimizer"),
    ("lr-inf", "c.sweep.learning_rate = (float('inf'),)", "config.sweep.learning_rate"),
    ("lr-bool", "c.sweep.learning_rate = (True,)", "config.sweep.learning_rate"),
    ("heads-bool", "c.sweep.heads = (True,)", "config.sweep.heads"),
    ("heads-not-a-list", "c.sweep = ml_collections.ConfigDict({**c.sweep.to_dict(), 'heads': 2})", "config.sweep.heads"),
    ("steps-bool", "c.train.steps = True", "config.train.steps"),
    ("missing-section", "del c['train']", "config.train"),
    ("missing-field", "del c.model['width']", "config.model.width"),
    ("seed-float", "del c['seed']\nc.seed = 0.5", "config.seed"),
    ("seed-beyond-32-bits", "c.seed = 2**32", "config.seed"),
    ("unknown-top-level-field", "c.optimizer = 'sgd'", "config.optimizer"),
    ("unknown-model-field", "c.model.heads = 4", "config.model.heads"),
    ("unknown-train-field", "c.train.learning_rate = 0.1", "config.train.learning_rate"),
    ("missing-sweep", "del c['sweep']", "config.sweep"),
]


@pytest.mark.parametrize("case,extra,match", FILE_CASES, ids=[c[0] for c in FILE_CASES])
def test_bad_config_file_is_one_line(trained, tmp_path, capsys, case, extra, match):
    _, workdir = trained
    before = snapshot(workdir)
    config = write_config(tmp_path / "bad.py", extra)
    code = cli.main(["train", "--config", config, "--workdir", workdir, "--no-progress"])
    assert "another config" not in assert_one_line_error(capsys, code, match)
    assert snapshot(workdir) == before


BROKEN_FILES = [
    ("syntax-error", "def get_config(:\n    pass\n", "--config"),
    ("no-get-config", "X = 1\n", "get_config"),
    ("import-error", "import no_such_module_xyz\n", "--config"),
    ("get-config-raises", "def get_config():\n    raise RuntimeError('boom\\nsecond line')\n", "--config"),
    ("get-config-returns-none", "def get_config():\n    return None\n", "--config"),
    ("get-config-returns-dict", "def get_config():\n    return {'experiment': 'sequence'}\n", "--config"),
    ("get-config-not-callable", "get_config = 3\n", "get_config"),
    ("binary-garbage", "\x00\x01\x02", "--config"),
]


@pytest.mark.parametrize("case,source,match", BROKEN_FILES, ids=[c[0] for c in BROKEN_FILES])
def test_broken_config_file_is_one_line(trained, tmp_path, capsys, case, source, match):
    _, workdir = trained
    before = snapshot(workdir)
    path = tmp_path / "broken.py"
    path.write_text(source)
    code = cli.main(["train", "--config", str(path), "--workdir", workdir, "--no-progress"])
    assert "another config" not in assert_one_line_error(capsys, code, match)
    assert snapshot(workdir) == before


def test_command_line_mistakes(trained, tmp_path, capsys):
    config, workdir = trained
    cfg_txt = tmp_path / "config.txt"  # not *.py: still loaded, then validated
    cfg_txt.write_text(open(config).read().replace("heads=(2,)", "heads=(5,)"))
    before = snapshot(workdir)
    cases = [
        (["train", "--workdir", workdir], "--config"),
        (["train", "--config", str(tmp_path / "missing.py"), "--workdir", workdir], "not found"),
        (["train", "--config", str(tmp_path), "--workdir", workdir], "not found"),  # a folder
        (["train", "--config", str(cfg_txt), "--workdir", workdir], "config.sweep.heads"),  # any file name
        (["train", "--config", config, "--workdir", workdir, "--config.sweep.heads=(3,)", "--dry-run"], "config.sweep.heads"),
        (["bogus-command"], "invalid choice"),
        (["configs", "--config.train.steps=3"], "only to 'mhjax train'"),
        (["analyze", "--workdir", workdir, "--config.train.steps=3"], "only to 'mhjax train'"),
    ]
    for argv, match in cases:
        assert_one_line_error(capsys, cli.main(argv), match)
    assert snapshot(workdir) == before


def test_workdir_that_is_a_file(trained, tmp_path, capsys):
    config, _ = trained
    path = tmp_path / "afile"
    path.write_text("not a folder")
    code = cli.main(["train", "--config", config, "--workdir", str(path), "--no-progress"])
    assert_one_line_error(capsys, code, "--workdir")
    assert path.read_text() == "not a folder"


def test_workdir_of_another_mhjax_version_is_refused(workdir_copy, capsys):
    config, workdir, _ = workdir_copy
    meta_path = os.path.join(workdir, "mhjax.json")
    meta = json.load(open(meta_path))
    meta["mhjax_version"] = "0.0.1-other"
    with open(meta_path, "w") as f:
        json.dump(meta, f)
    before = snapshot(workdir)
    code = cli.main(["train", "--config", config, "--workdir", workdir, "--no-progress"])
    assert "0.0.1-other" in assert_one_line_error(capsys, code, "written by mhjax")
    assert snapshot(workdir) == before


def test_truncated_metadata_is_refused(workdir_copy, capsys):
    config, workdir, _ = workdir_copy
    meta_path = os.path.join(workdir, "mhjax.json")
    with open(meta_path, "r+") as f:
        f.truncate(10)
    before = snapshot(workdir)
    code = cli.main(["train", "--config", config, "--workdir", workdir, "--no-progress"])
    assert meta_path in assert_one_line_error(capsys, code, "unreadable")
    assert snapshot(workdir) == before


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
    code = cli.main(["train", "--config", config, "--workdir", workdir, "--no-progress", f"--config.{section}.{field}={text}"])
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
        (["analyze", "--torch-checkpoint", str(tmp_path / "missing.pt"), "--heads", "4", "--task", "copy", "--out", out], "--torch-checkpoint"),
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
    for value, match in ((str(jax.local_device_count() + 1), "config.devices"), ("-1", "config.devices"), ("two", "config.devices")):
        code = cli.main(["train", "--config", config, "--workdir", workdir, f"--config.devices={value}"])
        assert_one_line_error(capsys, code, match)
    assert snapshot(workdir) == before


# ---- a few through a real subprocess: the real stderr holds one line, no traceback ----

def _cli_subprocess(*argv):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "mhjax", *argv], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)


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
    planted = ["checkpoint", "checkpoint.pkl", "_CHECKPOINT_METADATA.pkl", "default/data.pkl",
               "default/pytree.pkl", "default/_METADATA.pkl", "default/checkpoint.msgpack"]
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
                        if m.split(".")[0] in ("pickle", "dill", "cloudpickle", "joblib", "shelve", "marshal") and not path.endswith("torch_import.py"):
                            problems.append(f"{path}:{node.lineno} imports {m}")
                if isinstance(node, ast.Call):
                    func = ast.unparse(node.func)
                    if func in ("torch.load", "pickle.load", "pickle.loads", "eval", "exec") or func.endswith("PyTreeCheckpointHandler"):
                        problems.append(f"{path}:{node.lineno} calls {func}")
                    for kw in node.keywords:
                        if kw.arg == "allow_pickle" and not (isinstance(kw.value, ast.Constant) and kw.value.value is False):
                            problems.append(f"{path}:{node.lineno} {func}(allow_pickle=...)")
    assert not problems, problems
