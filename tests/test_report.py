"""`mhjax report`: W/report.md with tables and figures, before and after `mhjax analyze`."""

import os
import re

import matplotlib.image
import numpy as np
import pytest

import mhjax
from mhjax.cli import main
from mhjax.experiments import make_experiment
from mhjax.train.loop import run
from tests.conftest import tiny_sequence_config


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("report") / "w")
    run(make_experiment(tiny_sequence_config()), path, progress=False, log=lambda m: None)
    return path


def _links(text):
    return re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)


def test_report_before_and_after_analysis(workdir, capsys):
    matplotlib.image.imsave(
        os.path.join(workdir, "experiment_figure.png"), np.eye(40)
    )  # a figure an experiment left in W

    assert main(["report", "--workdir", workdir]) == 0
    out = capsys.readouterr()
    assert "report.md" in out.out and f"mhjax analyze --workdir {workdir}" in out.err
    text = open(os.path.join(workdir, "report.md")).read()
    assert "| task | heads | members | held-out accuracy % |" in text
    assert re.search(r"^\| copy \| 1 \| 1 \| \d+\.\d\d \|", text, re.M) and re.search(
        r"^\| copy \| 4 \| 1 \|", text, re.M
    )
    assert f"mhjax analyze --workdir {workdir}" in text
    links = _links(text)
    assert "report/curves.png" in links and "experiment_figure.png" in links
    for link in links:
        assert os.path.isfile(os.path.join(workdir, link)), link
    assert "| copy-h4-s0 | copy | 4 |" in text  # the per-member table

    assert main(["analyze", "--workdir", workdir, "--num-sequences", "3", "--no-plot", "--no-tensorboard"]) == 0
    capsys.readouterr()
    assert main(["report", "--workdir", workdir]) == 0
    assert "mhjax analyze" not in capsys.readouterr().err
    text = open(os.path.join(workdir, "report.md")).read()
    assert "No analysis yet" not in text
    for title in ("copy: mixing time", "copy: minimax fidelity %", "copy: synergy", "copy: attention rollout"):
        assert f"**{title}" in text
    assert re.search(r"^\| 4 \| -?\d+\.\d\d \| \d+ \|$", text, re.M)  # heads, accuracy synergy, DAG synergy
    assert re.search(r"^\| 4 \| \d+\.\d\d \| \d+\.\d{3} \|$", text, re.M)  # heads, accuracy, layer-0 mixing time
    links = _links(text)
    assert {"report/curves.png", "report/mixing_fidelity.png", "report/synergy.png"} <= set(links)
    for link in links:
        path = os.path.join(workdir, link)
        assert open(path, "rb").read(8) == b"\x89PNG\r\n\x1a\n", link
        assert link == "experiment_figure.png" or os.path.getsize(path) > 5000, link

    # Trained on from step 6 to 9: the step-6 analysis is named stale, with both steps and the refresh.
    config = tiny_sequence_config()
    config.train.steps = 9
    run(make_experiment(config), workdir, progress=False, log=lambda m: None)
    assert main(["report", "--workdir", workdir]) == 0
    line = f"The analysis is of step 6 but the results are of step 9: run `mhjax analyze --workdir {workdir}`"
    assert line in capsys.readouterr().err
    assert (
        f"**Stale analysis:** {line} to analyse step 9 (Python: `run.analyze()`)."
        in open(os.path.join(workdir, "report.md")).read()
    )
    with pytest.warns(UserWarning, match=r"of step 6 but the results are of step 9: run `run.analyze\(\)`"):
        mhjax.load(workdir).report()


def test_report_bad_workdir(tmp_path, capsys):
    assert main(["report", "--workdir", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--workdir" in err
    assert main(["report", "--workdir", str(tmp_path)]) == 2
    assert "results.json" in capsys.readouterr().err


def test_report_on_a_generic_sweep_without_tensorboard(tmp_path, capsys):
    """A mixture-like sweep: tables grouped by the swept fields (not the seed), its own PNGs embedded."""
    import json

    members = [
        {
            "name": f"h{h}-s{s}-n{n}",
            "heads": h,
            "seed": s,
            "num_train": n,
            "step_size": 1.0,
            "params": 10,
            "steps": 5,
            "train_loss": 0.5 / h + 0.01 * s,
            "test_loss": 0.6 / h,
            "test_accuracy": 0.9,
            "ntk_margin": 0.1 * h,
            "ntk_margin_gap": 1e-5,
            "program_wall_time_s": 1.0,
            "status": "ok",
        }
        for h in (1, 4)
        for s in (0, 1)
        for n in (32, 128)
    ]
    (tmp_path / "results.json").write_text(
        json.dumps({"experiment": "mixture", "title": "mhjax mixture sweep", "steps": 5, "members": members})
    )
    sweep = {"heads": [1, 4], "seed": [0, 1], "num_train": [32, 128], "step_size": [1.0]}
    (tmp_path / "mhjax.json").write_text(json.dumps({"config": {"experiment": "mixture", "sweep": sweep}}))
    matplotlib.image.imsave(tmp_path / "ntk_margin_vs_H.png", np.eye(30))
    assert main(["report", "--workdir", str(tmp_path)]) == 0
    assert "mhjax analyze" not in capsys.readouterr().err
    text = (tmp_path / "report.md").read_text()
    assert (
        "| heads | num_train | members | training loss | test loss | test accuracy % | ntk margin "
        "| program wall time s |" in text
    )
    # constant columns drop their "± 0" (issue 53)
    assert "| 4 | 128 | 2 | 0.1300 ± 0.0050 | 0.1500 | 90.00 | 0.4000 | 1.0 |" in text
    assert "![ntk_margin_vs_H](ntk_margin_vs_H.png)" in text and "Attention as a DAG" not in text


def test_error_bars_stay_inside_a_percentage():
    from mhjax.plotting.style import clipped_sd

    np.testing.assert_allclose(clipped_sd([2.0, 50.0, 99.0], [5.0, 5.0, 5.0], 0, 100), [[2, 5, 5], [5, 5, 1]])
    assert clipped_sd([1.0], None) is None


def test_an_analysis_of_some_members_names_the_others_and_the_sequences_note():
    from mhjax.workflows.report import analysis_notes

    results = {"steps": 4, "members": [{"name": "copy-h1-s0"}, {"name": "copy-h2-s0"}, {"name": "recall-h1-s0"}]}
    note = "--sequences applies to tasks with targets(tokens); ...: task recall: recall-h1-s0"
    analysis = {"step": 4, "members": {"copy-h1-s0": {}, "recall-h1-s0": {}}, "sequences_note": note}
    notes = analysis_notes(analysis, results, "W")
    assert notes[0].startswith("**Some members analysed:** 2 of 3; not yet copy-h2-s0 (")
    assert "--members GLOB" in notes[0] and notes[1] == note
    full = {"step": 4, "members": {m["name"]: {} for m in results["members"]}}
    assert analysis_notes(full, results, "W") == []
