"""Every output of a sweep carries the swept architecture fields (issue 38, item 3): results.json
and results.md, analysis.json, report.md, TensorBoard HParams and Run.to_pandas; and the report's
per-head-count tables keep members of other architectures apart."""

import json
import pathlib
import re

import pytest

import mhjax
from tests.conftest import tiny_sequence_config, tiny_train
from tests.test_architecture import hand_count

FIELDS = ("width", "num_layers", "mlp_dim", "dropout", "head_dim")
# width 16 and 32, head_dim None (parameter matching) and 8, at 2 heads; the other three swept at
# one value each. Attention widths: 16, 16 (2 x 8), 32 and 16.
MEMBERS = {
    "copy-w16-h2-s0": dict(width=16, head_dim=None, attention=16),
    "copy-w16-d8-h2-s0": dict(width=16, head_dim=8, attention=16),
    "copy-w32-h2-s0": dict(width=32, head_dim=None, attention=32),
    "copy-w32-d8-h2-s0": dict(width=32, head_dim=8, attention=16),
}


def W(run):
    return pathlib.Path(run.workdir)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    sweep = dict(heads=(2,), width=(16, 32), head_dim=(None, 8), num_layers=(1,), mlp_dim=(32,), dropout=(0.1,))
    config = tiny_train(tiny_sequence_config(**sweep), 2, 2, 0, 2)
    run = mhjax.sweep(config, tmp_path_factory.mktemp("arch") / "w", progress=False)
    run.analyze(num_sequences=2, plot=False)
    run.report()
    return run


def test_results_json_and_analysis_json_carry_every_swept_architecture_field(run):
    results = {m["name"]: m for m in run.results}
    analysis = json.loads((W(run) / "analysis" / "analysis.json").read_text())["members"]
    assert sorted(results) == sorted(analysis) == sorted(MEMBERS)
    for name, want in MEMBERS.items():
        expected = dict(width=want["width"], num_layers=1, mlp_dim=32, dropout=0.1, head_dim=want["head_dim"])
        assert {f: results[name][f] for f in FIELDS} == expected, name
        assert {f: analysis[name][f] for f in FIELDS} == expected, name
        assert results[name]["params"] == hand_count(want["width"], 1, 32, 16, 8, want["attention"]), name


def test_results_md_lists_the_architecture_columns_after_the_task_with_head_dim_none_as_a_value(run):
    lines = (W(run) / "results.md").read_text().splitlines()
    header = [c.strip() for c in lines[2].strip("|").split("|")]
    assert header[:9] == ["name", "task", *FIELDS, "heads", "seed"]
    rows = {cells[0]: cells for cells in ([c.strip() for c in line.strip("|").split("|")] for line in lines[4:8])}
    assert rows["copy-w32-h2-s0"][2:9] == ["32", "1", "32", "0.1", "None", "2", "0"]
    assert rows["copy-w32-d8-h2-s0"][2:9] == ["32", "1", "32", "0.1", "8", "2", "0"]


def test_report_md_keeps_members_of_other_architectures_in_rows_of_their_own(run):
    """The results table has a column per architecture field swept over more than one value and
    the parameter count as an integer; every per-head-count table of the analysis section is one
    architecture's: at one member per row its accuracy is that member's (analysis.json's)."""
    text = (W(run) / "report.md").read_text()
    assert "| task | heads | head_dim | width | members |" in text
    assert re.search(r"^\| copy \| 2 \| 8 \| 32 \| 1 \| .* \| 5,600 \| ", text, re.M)  # hand count: A = 16
    analysis = json.loads((W(run) / "analysis" / "analysis.json").read_text())["members"]
    labels = {
        "copy-w16-h2-s0": "copy, width 16, head_dim matched (width / H)",
        "copy-w16-d8-h2-s0": "copy, width 16, head_dim 8",
        "copy-w32-h2-s0": "copy, width 32, head_dim matched (width / H)",
        "copy-w32-d8-h2-s0": "copy, width 32, head_dim 8",
    }
    for name, label in labels.items():
        table = text.split(f"**{label}: mixing time**", 1)[1]
        row = re.search(r"^\| 2 \| ([0-9.]+) \|", table, re.M).group(1)
        assert row == f"{100 * analysis[name]['accuracy']:.2f}", name
    assert "**copy: mixing time**" not in text  # no table averages over architectures


def test_tensorboard_hparams_carry_every_swept_architecture_field(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    for name, want in (("copy-w32-h2-s0", "None"), ("copy-w16-d8-h2-s0", "8")):
        acc = EventAccumulator(str(W(run) / "tb" / name))
        acc.Reload()
        content = acc.PluginTagToContent("hparams")
        start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
        hparams = start.session_start_info.hparams
        assert hparams["head_dim"].string_value == want  # None beside 8: text, one type per field
        assert hparams["width"].number_value == MEMBERS[name]["width"]
        assert (hparams["num_layers"].number_value, hparams["mlp_dim"].number_value) == (1, 32)
        assert hparams["dropout"].number_value == pytest.approx(0.1)
        experiment = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/experiment"]).experiment
        assert set(FIELDS) <= {h.name for h in experiment.hparam_infos}


def test_to_pandas_has_a_column_per_architecture_field_and_head_dim_none_is_na_not_nan(run):
    pd = pytest.importorskip("pandas")
    frame = run.to_pandas().set_index("name")
    assert set(FIELDS) <= set(frame.columns)
    assert str(frame["head_dim"].dtype) == "Int64"
    assert frame.loc["copy-w16-d8-h2-s0", "head_dim"] == 8 and pd.isna(frame.loc["copy-w16-h2-s0", "head_dim"])
    assert frame["width"].to_dict() == {name: m["width"] for name, m in MEMBERS.items()}
    groups = frame.groupby(["width", "head_dim"], dropna=False)["params"].first()
    assert len(groups) == 4  # the parameter-matched members kept, a group per width
    assert sorted(groups.tolist()) == sorted(
        hand_count(m["width"], 1, 32, 16, 8, m["attention"]) for m in MEMBERS.values()
    )


def test_the_console_table_writes_head_dim_none_as_none_as_results_md_does():
    from mhjax.config import apply_overrides
    from mhjax.experiments import make_experiment, override_defaults
    from mhjax.train.console import summary_lines

    config = tiny_sequence_config(heads=(2,))
    config = apply_overrides(config, {"sweep.head_dim": "None,8"}, override_defaults(config))
    experiment = make_experiment(config)
    records = [{**m.hparams, **experiment.member_info(m), "eval_accuracy": 0.5} for m in experiment.members]
    rows = [line.split() for line in summary_lines(experiment.summary_table(), records)[1:]]
    assert [row[:3] for row in rows] == [["copy", "2", "None"], ["copy", "2", "8"]]
