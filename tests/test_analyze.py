"""`mhjax analyze` (analysis/metrics, commands/analyze): released checkpoints, CLI, sweep workdirs, errors."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from mhjax.analysis import dag, metrics
from mhjax.cli import register_analyze as register
from mhjax.commands.analyze import run_analyze
from mhjax.config import ConfigError
from mhjax.models import probe
from mhjax.plotting.images import attention_grid
from mhjax.workflows import analyze

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
CKPT_DIR = SHARED / "reference" / "beyond_parallelism" / "checkpoints"
MODELS = [(h, task) for task in ("copy", "cycle") for h in (1, 4, 8, 16)]
needs_ckpts = pytest.mark.skipif(
    not SHARED.is_dir() or not all((CKPT_DIR / f"{h}_heads_{t}.pt").exists() for h, t in MODELS),
    reason=f"released reference checkpoints not found under {CKPT_DIR}",
)
LAYER_KEYS = {
    "layer",
    "mixing_time_mean",
    "mixing_time_std",
    "fidelity_pct_mean",
    "fidelity_pct_std",
    "best_single_fidelity_pct_mean",
    "combined_beats_best_share",
    "head_weights",
}


def cli(argv):
    """mhjax.cli.main if it dispatches `analyze`, else the same parser class + run_analyze."""
    from mhjax import cli as mcli

    if "analyze" in getattr(mcli, "COMMANDS", {}):
        return mcli.main(argv)
    parser = mcli._Parser(prog="mhjax")
    register(parser.add_subparsers(dest="command", parser_class=mcli._Parser))
    try:
        args = parser.parse_args(argv)
    except ConfigError as exc:
        print(f"mhjax: error: {exc}", file=sys.stderr)
        return 2
    return run_analyze(args)


def assert_one_line_error(capsys, rc, option):
    err = capsys.readouterr().err.strip()
    assert rc == 2
    assert len(err.splitlines()) == 1, err
    assert err.startswith("mhjax: error:") and option in err, err
    assert "Traceback" not in err


# ------------------------------ released checkpoints --------------------------
@needs_ckpts
@pytest.mark.parametrize("heads,task", MODELS, ids=[f"{h}_heads_{t}" for h, t in MODELS])
def test_released_checkpoint_accuracy(heads, task):
    from mhjax.data.sequences import TASKS, targets_for
    from mhjax.io.torch_import import load_reference_params

    params, info = load_reference_params(CKPT_DIR / f"{heads}_heads_{task}.pt", heads)
    assert (info["num_layers"], info["d_model"], info["max_len"], info["vocab_size"]) == (4, 64, 100, 256)
    tokens = metrics.random_tokens(20, 100, 256, seed=0)
    preds, attn = probe.predict(params, heads, tokens)
    assert attn.shape == (4, 20, heads, 100, 100)
    correct = preds == np.asarray(targets_for(TASKS.index(task), tokens))
    if task == "copy":
        assert correct.mean() == 1.0
    else:  # position 0's target is the last input token, invisible to a causal model
        assert correct.mean() >= 0.985
        assert correct[:, 1:].mean() == 1.0


@needs_ckpts
def test_cli_torch_checkpoint_end_to_end(tmp_path, capsys):
    out = tmp_path / "an"
    rc = cli(
        [
            "analyze",
            "--torch-checkpoint",
            str(CKPT_DIR / "4_heads_copy.pt"),
            "--heads",
            "4",
            "--task",
            "copy",
            "--out",
            str(out),
            "--num-sequences",
            "3",
        ]
    )
    assert rc == 0, capsys.readouterr().err
    assert "layer 3" in capsys.readouterr().out
    data = json.loads((out / "analysis.json").read_text())
    assert data["accuracy"] == 1.0 and data["num_sequences"] == 3 and data["seq_len"] == 100
    assert data["conventions"]["include_sink"] is True and data["conventions"]["horizon"] == 100
    assert data["conventions"]["max_steps"] == 100 and data["conventions"]["chain"] == "reference"
    assert [l["layer"] for l in data["layers"]] == [0, 1, 2, 3]
    for layer in data["layers"]:
        assert LAYER_KEYS <= set(layer)
        assert len(layer["head_weights"]) == 4 and abs(sum(layer["head_weights"]) - 1) < 1e-5
        assert 1.0 <= layer["mixing_time_mean"] <= 100.0 and 0.0 <= layer["fidelity_pct_mean"] <= 100.0
        assert 0.0 <= layer["combined_beats_best_share"] <= 1.0
    assert (out / "analysis.md").read_text().startswith("# mhjax analyze")
    assert (out / "analysis.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@needs_ckpts
def test_sequences_file_and_learned_weights(tmp_path):
    from mhjax.io.torch_import import load_reference_params

    path = CKPT_DIR / "8_heads_cycle.pt"
    tokens = np.random.default_rng(0).integers(0, 256, size=(2, 40))
    np.save(tmp_path / "seq.npy", tokens)
    res = analyze.analyze_torch_checkpoint(path, 8, "cycle", None, sequences=tmp_path / "seq.npy")
    assert (res["num_sequences"], res["seq_len"]) == (2, 40)
    params, _ = load_reference_params(path, 8)
    # the metrics are the dag functions on the learned-weight combination, sequence by sequence
    _, attn = probe.predict(params, 8, tokens)
    l = 2
    beta = dag.head_weights("learned", 8, out_kernel=params[f"block_{l}"]["attn"]["out"]["kernel"])
    np.testing.assert_allclose(res["layers"][l]["head_weights"], np.asarray(beta), rtol=1e-6)
    A = dag.combine(attn[l], beta)
    mix = np.asarray(dag.mixing_time(A))
    fid = 100 * np.asarray(dag.minimax_fidelity(A, 100, include_sink=True))
    np.testing.assert_allclose(res["layers"][l]["mixing_time_mean"], mix.mean(), rtol=1e-5)
    np.testing.assert_allclose(res["layers"][l]["mixing_time_std"], mix.std(), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(res["layers"][l]["fidelity_pct_mean"], fid.mean(), rtol=1e-5, atol=1e-9)


@needs_ckpts
@pytest.mark.parametrize(
    "argv,option",
    [
        (["--heads", "8"], "--heads"),  # file name says 4 heads
        (["--heads", "3"], "--heads"),  # not a divisor of 64
        (["--heads", "4", "--sequences", "{bad1d}"], "--sequences"),
        (["--heads", "4", "--sequences", "{float}"], "--sequences"),
        (["--heads", "4", "--sequences", "{range}"], "--sequences"),
        (["--heads", "4", "--sequences", "{long}"], "--sequences"),
        (["--heads", "4", "--sequences", "{missing}"], "--sequences"),
        (["--heads", "4", "--num-sequences", "0"], "--num-sequences"),
    ],
)
def test_bad_input_with_checkpoint(tmp_path, capsys, argv, option):
    files = {
        "bad1d": np.zeros(10, np.int64),
        "float": np.zeros((2, 10), np.float32),
        "range": np.full((2, 10), 256),
        "long": np.zeros((2, 101), np.int32),
    }
    for name, arr in files.items():
        np.save(tmp_path / f"{name}.npy", arr)
    argv = [a.format(**{k: str(tmp_path / f"{k}.npy") for k in [*files, "missing"]}) for a in argv]
    rc = cli(
        [
            "analyze",
            "--torch-checkpoint",
            str(CKPT_DIR / "4_heads_copy.pt"),
            "--task",
            "copy",
            "--out",
            str(tmp_path / "o"),
            *argv,
        ]
    )
    assert_one_line_error(capsys, rc, option)


@pytest.mark.parametrize(
    "argv,option",
    [
        (
            ["--torch-checkpoint", "/nonexistent/4_heads_copy.pt", "--heads", "4", "--task", "copy", "--out", "o"],
            "--torch-checkpoint",
        ),
        (
            ["--torch-checkpoint", "/nonexistent/4_heads_copy.pt", "--heads", "4", "--task", "reverse", "--out", "o"],
            "--task",
        ),
        (["--torch-checkpoint", "x.pt", "--task", "copy", "--out", "o"], "--heads"),
        (["--torch-checkpoint", "x.pt", "--heads", "4", "--task", "copy"], "--out"),
        (["--heads", "4"], "--torch-checkpoint/--workdir"),
        (["--workdir", "/nonexistent/sweep"], "--workdir"),
        (["--workdir", "w", "--torch-checkpoint", "x.pt"], "--torch-checkpoint/--workdir"),
        (["--heads", "four"], "--heads"),  # argparse errors are one line too
    ],
)
def test_bad_input_without_checkpoint(tmp_path, monkeypatch, capsys, argv, option):
    monkeypatch.chdir(tmp_path)
    assert_one_line_error(capsys, cli(["analyze", *argv]), option)


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit):
        cli(["analyze", "--help"])
    text = capsys.readouterr().out
    for opt in (
        "--torch-checkpoint",
        "--workdir",
        "--heads",
        "--task",
        "--out",
        "--sequences",
        "--num-sequences",
        "--seed",
        "--horizon",
        "--max-steps",
        "--chain",
        "--exclude-sink",
        "--no-tensorboard",
        "--no-ablation",
    ):
        assert opt in text
    assert "(default: 50)" in text


# ------------------------------ pure pieces ----------------------------------
def test_layer_metrics_matches_dag_per_item():
    rng = np.random.default_rng(1)
    L, N, H, T = 2, 3, 3, 7
    logits = np.where(np.tril(np.ones((T, T), bool)), rng.normal(size=(L, N, H, T, T)) * 2, -np.inf)
    attn = np.exp(logits - logits.max(-1, keepdims=True))
    attn /= attn.sum(-1, keepdims=True)
    beta = rng.random((L, H))
    beta /= beta.sum(-1, keepdims=True)
    got = jax.device_get(
        metrics.layer_metrics(attn.astype(np.float32), beta.astype(np.float32), block=4)
    )  # 6 items: padded
    for l in range(L):
        for n in range(N):
            A = dag.combine(attn[l, n], beta[l])
            syn = dag.synergy(attn[l, n], beta[l], 100, True)
            np.testing.assert_allclose(got["mixing_time"][l, n], dag.mixing_time(A), rtol=1e-5)
            np.testing.assert_allclose(got["fidelity"][l, n], syn["combined"], rtol=1e-5)
            np.testing.assert_allclose(got["best_single"][l, n], syn["best_single"], rtol=1e-5)
            assert bool(got["beats"][l, n]) == bool(syn["combined_beats_best"])


def test_member_params_slices_program_positions():
    params = {"w": np.arange(3 * 2).reshape(3, 2)}
    from mhjax.train.engine import Program

    sweep = SimpleNamespace(programs=[Program("a", [2, 0], None), Program("b", [1], None)])
    states = {"a": SimpleNamespace(params={"w": params["w"][:2]}), "b": SimpleNamespace(params={"w": params["w"][2:]})}
    got = analyze.member_params(sweep, states)
    np.testing.assert_array_equal(got[2]["w"], [0, 1])  # position 0 of program a
    np.testing.assert_array_equal(got[0]["w"], [2, 3])  # position 1 of program a
    np.testing.assert_array_equal(got[1]["w"], [4, 5])


def test_attention_grid_image():
    attn = np.tril(np.ones((3, 5, 5))) / np.arange(1, 6)[:, None]
    img = attention_grid(attn, attn.mean(0))
    assert img.dtype == np.uint8 and img.ndim == 3 and img.shape[2] == 3
    assert img.shape[0] >= 2 * 128 and img.shape[1] >= 2 * 128  # 4 titled panels in a 2 x 2 grid, >= 128 px each


# ------------------------------ a trained sweep --------------------------------
@pytest.fixture(scope="module")
def sweep_workdir(tmp_path_factory):
    from mhjax.config import apply_overrides, load_config_file
    from mhjax.experiments import make_experiment
    from mhjax.train.loop import run

    config = apply_overrides(
        load_config_file(str(ROOT / "configs" / "quick.py")),
        {
            "model.width": "16",
            "model.num_layers": "1",
            "model.seq_len": "8",
            "model.mlp_dim": "16",
            "model.vocab_size": "16",
            "train.steps": "4",
            "train.chunk_steps": "4",
            "train.eval_every": "0",
            "train.checkpoint_every": "0",
            "sweep.heads": "(1, 2)",
            "sweep.task": "('copy',)",
            "data.num_train": "16",
            "data.batch_size": "8",
            "data.num_eval": "8",
            "strategy": "fused",
        },
    )
    workdir = tmp_path_factory.mktemp("sweep")
    run(make_experiment(config), str(workdir), progress=False, log=lambda m: None)
    return workdir


def test_workdir_every_member_and_tensorboard(sweep_workdir, capsys):
    import ml_collections
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mhjax.experiments import make_experiment
    from mhjax.io.workdir import Workdir

    rc = cli(["analyze", "--workdir", str(sweep_workdir), "--num-sequences", "3"])
    assert rc == 0, capsys.readouterr().err
    data = json.loads((sweep_workdir / "analysis" / "analysis.json").read_text())
    assert data["step"] == 4
    assert set(data["members"]) == {"copy-h1-s0", "copy-h2-s0"}
    for name, entry in data["members"].items():
        assert entry["name"] == name and entry["task"] == "copy" and entry["heads"] in (1, 2)
        assert 0.0 <= entry["accuracy"] <= 1.0 and entry["seq_len"] == 8 and entry["num_sequences"] == 3
        assert [l["layer"] for l in entry["layers"]] == [0]
        assert LAYER_KEYS <= set(entry["layers"][0])
        assert len(entry["layers"][0]["head_weights"]) == entry["heads"]
        if entry["heads"] == 1:  # a single head is its own best head
            assert entry["layers"][0]["combined_beats_best_share"] == 0.0
        events = EventAccumulator(str(sweep_workdir / "tb" / name), size_guidance={"images": 0, "scalars": 0})
        events.Reload()
        assert "analysis/attention/layer0" in events.Tags()["images"]
        assert {"analysis/layer0/mixing_time", "analysis/layer0/fidelity_pct", "analysis/accuracy"} <= set(
            events.Tags()["scalars"]
        )
        assert events.Scalars("analysis/layer0/mixing_time")[-1].step == 4
        assert {"analysis/loss", "analysis/rollout_min", "analysis/layer0/rollout_min"} <= set(events.Tags()["scalars"])
        assert "analysis/layer0/accuracy_synergy" in events.Tags()["scalars"]
        assert "analysis/rollout/sink_row" in events.Tags()["images"]
        assert entry["loss"] > 0 and 0 < entry["rollout_min"] <= 1 and "rollout_min_mean_heads" in entry
        ablated = entry["layers"][0]["ablation"]
        assert all(len(ablated[k]) == entry["heads"] for k in ("loss_without", "accuracy_only"))
        assert "train/loss" in events.Tags()["scalars"]  # same run as training
        # the HParams metrics the experiment lists are the tags analyze logs (analysis/tags.py)
        metrics = make_experiment(ml_collections.ConfigDict(Workdir(sweep_workdir).config())).metric_tags()
        assert metrics and set(metrics) <= set(events.Tags()["scalars"])
    assert (sweep_workdir / "analysis" / "analysis.md").exists()
    assert (sweep_workdir / "analysis" / "analysis.png").exists()


def test_workdir_rejects_heads_and_missing_checkpoint(sweep_workdir, tmp_path, capsys):
    assert_one_line_error(capsys, cli(["analyze", "--workdir", str(sweep_workdir), "--heads", "2"]), "--heads")
    (tmp_path / "mhjax.json").write_text((sweep_workdir / "mhjax.json").read_text())
    assert_one_line_error(capsys, cli(["analyze", "--workdir", str(tmp_path)]), "--workdir")


# ------------------------------ some members (--members) ------------------------
def test_members_merge_keeps_the_other_entries_byte_for_byte(sweep_workdir, tmp_path, capsys):
    out = tmp_path / "some"
    common = ["analyze", "--workdir", str(sweep_workdir), "--out", str(out), "--num-sequences", "3"]
    common += ["--no-tensorboard", "--no-plot"]
    assert cli([*common, "--members", "copy-h1-s0"]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    assert "copy-h1-s0:" in printed and "copy-h2-s0:" not in printed
    first = json.loads((out / "analysis.json").read_text())
    assert set(first["members"]) == {"copy-h1-s0"} and set(first["by_step"]["4"]) == {"copy-h1-s0"}
    before = json.dumps(first["by_step"]["4"]["copy-h1-s0"])
    assert cli([*common, "--members", "*-h2-*", "--members", "nothing-but-a-second-glob*"]) == 2
    assert "--members: 'nothing-but-a-second-glob*' matches no member" in capsys.readouterr().err
    assert cli([*common, "--members", "*-h2-*"]) == 0, capsys.readouterr().err
    second = json.loads((out / "analysis.json").read_text())
    assert list(second["members"]) == ["copy-h1-s0", "copy-h2-s0"] and second["step"] == 4
    assert json.dumps(second["members"]["copy-h1-s0"]) == before
    assert json.dumps(second["by_step"]["4"]["copy-h1-s0"]) == before
    assert second["members"]["copy-h2-s0"]["heads"] == 2 and "copy-h2-s0" in (out / "analysis.md").read_text()
    # other options with some members: refused in one line (the kept entries would mix options)
    assert_one_line_error(capsys, cli([*common[:-4], "--num-sequences", "2", "--members", "copy-h1*"]), "--members")


def test_members_glob_matching_nothing_is_one_line(sweep_workdir, tmp_path, capsys):
    import mhjax

    argv = ["analyze", "--workdir", str(sweep_workdir), "--out", str(tmp_path), "--members", "cycle-*"]
    rc = cli(argv)
    err = capsys.readouterr().err
    assert_one_line_error(SimpleNamespace(readouterr=lambda: SimpleNamespace(err=err)), rc, "--members")
    assert "copy-h1-s0, copy-h2-s0" in err
    with pytest.raises(
        ConfigError, match=r"^members: 'cycle-\*' matches no member \(members: copy-h1-s0, copy-h2-s0\)"
    ):
        mhjax.load(sweep_workdir).analyze(members=["cycle-*"], out=tmp_path, plot=False, tensorboard=False)
    assert not (tmp_path / "analysis.json").exists()


@pytest.mark.slow  # ~30 s: two tasks analysed; --sequences is tested on one
def test_sequences_apply_to_tasks_with_targets_the_others_named(tmp_path, capsys):
    import mhjax
    from tests.conftest import tiny_sequence_config, tiny_train

    config = tiny_train(tiny_sequence_config(task=("copy", "recall"), heads=(1,)), 3, 3, 0, 3)
    mhjax.sweep(config, tmp_path / "w", progress=False)
    tokens = np.random.default_rng(0).integers(0, 16, (4, 8)).astype(np.int32)
    np.save(tmp_path / "seq.npy", tokens)
    argv = ["analyze", "--workdir", str(tmp_path / "w"), "--sequences", str(tmp_path / "seq.npy")]
    assert cli([*argv, "--num-sequences", "3", "--no-tensorboard", "--no-plot"]) == 0, capsys.readouterr().err
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("--sequences")]
    assert len(lines) == 1 and "task recall: recall-h1-s0" in lines[0] and "copy-h1-s0" not in lines[0]
    data = json.loads((tmp_path / "w" / "analysis" / "analysis.json").read_text())
    assert data["members"]["copy-h1-s0"]["num_sequences"] == 4  # the given file
    assert data["members"]["recall-h1-s0"]["num_sequences"] == 3  # its sampler's, --num-sequences
    assert data["source"]["sequences"].endswith("seq.npy") and data["sequences_note"] == lines[0]
    assert lines[0] in (tmp_path / "w" / "analysis" / "analysis.md").read_text()
