"""`mhjax report --reference DIR`: released checkpoints beside a tiny sweep, the claims checklist, errors."""

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest

from mhjax.analysis import claims, metrics
from mhjax.cli import main
from mhjax.experiments import make_experiment
from mhjax.train.loop import run
from tests.conftest import tiny_sequence_config

CKPT_DIR = Path(__file__).resolve().parents[2] / "shared" / "reference" / "beyond_parallelism" / "checkpoints"
RELEASED = ("1_heads_copy.pt", "4_heads_copy.pt", "4_heads_cycle.pt")  # enough for both tasks, quick to analyse
needs_ckpts = pytest.mark.skipif(
    not all((CKPT_DIR / n).exists() for n in RELEASED),
    reason=f"released reference checkpoints not found under {CKPT_DIR}",
)


def _one_line_error(capsys, rc, option):
    err = capsys.readouterr().err.strip()
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert err.startswith("mhjax: error:") and option in err and "Traceback" not in err, err


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("repro") / "w")
    config = tiny_sequence_config(task=("copy", "cycle"), heads=(1, 4), seed=(0, 1))
    run(make_experiment(config), path, progress=False, log=lambda m: None)
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    path = tmp_path_factory.mktemp("released")
    for name in RELEASED:
        os.symlink(CKPT_DIR / name, path / name)
    (path / "notes.txt").write_text("not a checkpoint")
    return str(path)


@pytest.mark.slow  # ~32 s: the released-checkpoint comparison end to end
@needs_ckpts
def test_report_beside_released_checkpoints(workdir, reference, capsys):
    assert main(["report", "--workdir", workdir, "--reference", reference]) == 0
    text = open(os.path.join(workdir, "report.md")).read()
    assert "## Reproduction beside the released checkpoints" in text and "No analysis of the sweep yet" in text
    assert "arXiv 2507.02944" in text and "report/reproduction_curves.png" in text
    assert "run `mhjax analyze --workdir W`" in text  # the mhjax column of the checklist

    assert (
        main(["analyze", "--workdir", workdir, "--num-sequences", "3", "--seed", "5", "--no-plot", "--no-tensorboard"])
        == 0
    )
    capsys.readouterr()
    assert main(["report", "--workdir", workdir, "--reference", reference]) == 0
    text = open(os.path.join(workdir, "report.md")).read()
    assert "No analysis of the sweep yet" not in text
    # the released models were evaluated on the sweep's own sequences: 3 of length 8 from seed 5
    released = json.loads(open(os.path.join(workdir, "report", "released.json")).read())["members"]
    assert sorted(e["name"] for e in released) == ["released-copy-h1", "released-copy-h4", "released-cycle-h4"]
    tokens = metrics.random_tokens(3, 8, 16, seed=5)
    direct = metrics.analyze_checkpoint(CKPT_DIR / "4_heads_cycle.pt", 4, "cycle", sequences=tokens)
    entry = next(e for e in released if e["name"] == "released-cycle-h4")
    assert (entry["num_sequences"], entry["seq_len"], entry["steps"]) == (3, 8, 20000)
    assert entry["accuracy"] == direct["accuracy"]
    np.testing.assert_allclose(
        [x["fidelity_pct_mean"] for x in entry["layers"]], [x["fidelity_pct_mean"] for x in direct["layers"]]
    )
    # side-by-side rows: heads, then mhjax (mean ± std over 2 seeds) and released per layer
    assert re.search(r"^\| 4 \| \d+\.\d\d ± \d+\.\d\d \| \d+\.\d\d \|", text, re.M)
    assert re.search(r"^\| copy \| 1 \| \d+\.\d\d ± \d+\.\d\d \| \d+\.\d\d ± \d+\.\d\d \| \d+\.\d\d \|$", text, re.M)
    rows = re.findall(
        r"^\| \(([a-e])\) .*? \| (copy|cycle) \| \*\*([a-z ]+)\*\*.*\| (?:\*\*([a-z ]+)\*\*|-).*\|$", text, re.M
    )
    assert {(c, t) for c, t, _, _ in rows} == {
        ("a", "copy"),
        ("b", "cycle"),
        ("c", "copy"),
        ("c", "cycle"),
        ("d", "copy"),
        ("d", "cycle"),
        ("e", "copy"),
        ("e", "cycle"),
    }
    verdicts = {claims.HOLDS, claims.FAILS, claims.NOT_YET, claims.NOT_JUDGED}
    assert all(ours in verdicts for _, _, ours, _ in rows)
    assert (
        dict(((c, t), r) for c, t, _, r in rows)[("b", "cycle")] == claims.NOT_JUDGED
    )  # no curves for released models
    cached = os.path.getmtime(os.path.join(workdir, "report", "released.json"))
    assert main(["report", "--workdir", workdir, "--reference", reference]) == 0  # same sequences: the cache is reused
    assert os.path.getmtime(os.path.join(workdir, "report", "released.json")) == cached
    for link in ("report/reproduction_curves.png", "report/reproduction_layers.png"):
        assert link in text and open(os.path.join(workdir, link), "rb").read(8) == b"\x89PNG\r\n\x1a\n"


@needs_ckpts
@pytest.mark.slow  # ~14 s: test_reference_errors runs the reference path
def test_reference_longer_than_the_released_models(tmp_path, reference, capsys):
    path = str(tmp_path / "w")
    config = tiny_sequence_config(heads=(1,))
    config.model.seq_len = 101  # the released models have 100 positions
    with config.train.unlocked():
        config.train.update(dict(steps=1, chunk_steps=1, eval_every=0, checkpoint_every=1))
    run(make_experiment(config), path, progress=False, log=lambda m: None)
    _one_line_error(capsys, main(["report", "--workdir", path, "--reference", reference]), "--reference")


def test_reference_errors(workdir, tmp_path, capsys):
    _one_line_error(
        capsys, main(["report", "--workdir", workdir, "--reference", str(tmp_path / "missing")]), "--reference"
    )
    (tmp_path / "heads_copy.pt").write_bytes(b"")  # not {H}_heads_{task}.pt
    _one_line_error(capsys, main(["report", "--workdir", workdir, "--reference", str(tmp_path)]), "--reference")


# ------------------------------------------------------------------ the claims on synthetic numbers
def entry(task, heads, seed=0, accuracy=1.0, mixing=(5.0, 5.0), fidelity=(1.0, 1.0), share=0.8, seq_len=100):
    return {
        "name": f"{task}-h{heads}-s{seed}",
        "task": task,
        "heads": heads,
        "seq_len": seq_len,
        "accuracy": accuracy,
        "layers": [
            {"mixing_time_mean": m, "fidelity_pct_mean": f, "combined_beats_best_share": share}
            for m, f in zip(mixing, fidelity)
        ],
    }


def sweep(
    task="copy", accuracy=1.0, mixing=(20.0, 10.0, 7.0, 6.0), fidelity=(0.1, 1.0, 1.5, 2.0), share=0.7, noise=0.0
):
    """Two seeds per head count; layer values scale with the head count's position, seeds differ by ±noise."""
    out = []
    for k, heads in enumerate((1, 4, 8, 16)):
        for seed, sign in ((0, -1), (1, 1)):
            out.append(
                entry(
                    task,
                    heads,
                    seed,
                    accuracy,
                    (mixing[k] + sign * noise,) * 2,
                    (fidelity[k] + sign * noise,) * 2,
                    0.0 if heads == 1 else share,
                )
            )
    return out


def by_claim(verdicts):
    return {(v.claim, v.task): v.verdict for v in verdicts}


def test_claims_hold():
    entries = sweep("copy") + sweep("cycle", accuracy=0.985)  # cycle's ceiling at T=100 is 99%: 98.5% is learnt
    learnt = {e["name"]: 100 * (1 + k // 2) for k, e in enumerate(e for e in entries if e["task"] == "cycle")}
    v = by_claim(claims.check_claims(entries, 1000, learnt))
    assert set(v.values()) == {claims.HOLDS}, v
    assert len(v) == 8


def test_claims_do_not_hold():
    entries = sweep("copy", mixing=(6.0, 7.0, 10.0, 20.0), fidelity=(2.0, 1.5, 1.0, 0.1), share=0.3)
    entries += sweep("cycle", accuracy=0.985)
    learnt = {e["name"]: 500 for e in entries if e["task"] == "cycle"}  # every head count at the same step
    v = by_claim(claims.check_claims(entries, 20000, learnt))
    assert v[("c", "copy")] == v[("d", "copy")] == v[("e", "copy")] == v[("b", "cycle")] == claims.FAILS
    assert v[("c", "cycle")] == claims.HOLDS
    # copy not learnt by H=16 after the paper's full length: (a) fails
    entries[6]["accuracy"] = 0.5  # copy, 16 heads, seed 0
    assert by_claim(claims.check_claims(entries, 20000, learnt))[("a", "copy")] == claims.FAILS


def test_claims_trend_within_seed_noise_is_not_a_trend():
    flat = sweep("copy", mixing=(10.0, 9.8, 9.9, 9.7), noise=0.5)  # moves down by 0.3, seeds differ by 1.0
    assert by_claim(claims.check_claims(flat, 1000))[("c", "copy")] == claims.FAILS
    bumpy = sweep("copy", mixing=(20.0, 10.0, 10.5, 6.0), noise=0.5)  # 10.0 -> 10.5: a reversal within the noise
    assert by_claim(claims.check_claims(bumpy, 1000))[("c", "copy")] == claims.HOLDS
    single = [e for e in bumpy if e["name"].endswith("s0")]  # one model per H: any reversal counts
    assert by_claim(claims.check_claims(single, 20000))[("c", "copy")] == claims.FAILS
    for e in single:  # ... unless it is within the standard error over the evaluation sequences (1.0 / sqrt(4))
        e["num_sequences"] = 4
        for layer in e["layers"]:
            layer["mixing_time_std"] = 1.0
    assert by_claim(claims.check_claims(single, 20000))[("c", "copy")] == claims.HOLDS


def test_claims_not_yet_and_not_judged():
    entries = sweep("copy") + sweep("cycle", accuracy=0.5)
    entries[0]["accuracy"] = 0.9  # copy with 1 head, seed 0, not learnt after 1,000 steps
    v = by_claim(claims.check_claims(entries, 1000, {e["name"]: None for e in entries}))
    assert all(v[(c, t)] == claims.NOT_YET for c, t in v), v
    assert by_claim(claims.check_claims(entries, 1000))[("b", "cycle")] == claims.NOT_JUDGED  # no learning curves
    # a seed that never learns counts as later than every step: cycle learnt by H=1 only is still "more slowly"
    learnt = {e["name"]: (300 if e["heads"] == 1 else None) for e in entries}
    assert by_claim(claims.check_claims(entries, 1000, learnt))[("b", "cycle")] == claims.HOLDS


def test_learnt_threshold_follows_the_ceiling():
    assert claims.threshold("copy", 100) == pytest.approx(0.99)
    assert claims.threshold("cycle", 100) == pytest.approx(0.98)
    assert claims.threshold("cycle", 8) == pytest.approx(7 / 8 - 0.01)
    assert claims.learnt_step([100, 200, 300], [0.5, 0.981, 0.99], "cycle", 100) == 200
    assert claims.learnt_step([100, 200], [0.5, 0.97], "cycle", 100) is None
