"""Bad configs and inputs through the CLI: exit status 2, exactly one line on stderr, no
traceback, nothing compiled, and an existing workdir left exactly as it was.

Most cases call mhjax.cli.main in-process (fast); a few run `python -m mhjax` in a
subprocess to show the real stderr stream holds that one line and nothing else.
"""

import json
import os

import pytest

from mhjax import cli
from tests.errors_common import assert_one_line_error, snapshot, write_config

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
    ("head-dim-zero", ["--config.model.head_dim=0"], "config.model.head_dim"),
    ("swept-width-not-divided", ["--config.sweep.width=(15,16)"], "config.sweep.heads: 2 heads at width 15"),
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
    ("attention-unknown", ["--config.attention=triton"], "config.attention"),
    ("experiment-unknown", ["--config.experiment=vision"], "config.experiment"),
    ("unknown-field", ["--config.model.widht=16"], "config.model.widht"),
    ("unknown-section", ["--config.optimizer.lr=1"], "config.optimizer.lr"),
    ("schedule-unknown", ["--config.train.schedule=linear"], "config.train.schedule"),
    (
        "warmup-not-below-steps",
        ["--config.train.schedule=warmup_cosine", "--config.train.warmup_steps=99"],
        "config.train.warmup_steps",
    ),
    ("warmup-without-schedule", ["--config.train.warmup_steps=2"], "config.train.warmup_steps"),
    ("weight-decay-negative", ["--config.train.weight_decay=-0.1"], "config.train.weight_decay"),
    ("clip-norm-zero", ["--config.train.clip_norm=0"], "config.train.clip_norm"),
    ("other-config-in-workdir", ["--config.train.steps=1"], "another config"),  # fewer steps: larger ones extend
    ("unknown-option", ["--bogus"], "unrecognized arguments"),
]


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
    (
        "heads-not-a-list",
        "c.sweep = ml_collections.ConfigDict({**c.sweep.to_dict(), 'heads': 2})",
        "config.sweep.heads",
    ),
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
        (
            ["train", "--config", config, "--workdir", workdir, "--config.sweep.heads=(3,)", "--dry-run"],
            "config.sweep.heads",
        ),
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
