"""configs/head_size.py (docs/head_size.md): head count apart from head size on the tasks where
head count matters; and benchmarks/studies/head_size_table.py, which writes that page's table."""

import os
import sys

import mhjax
from mhjax.experiments import make_experiment
from tests.test_architecture import hand_count

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "studies"))


def test_head_size_config_is_tasks_model_at_heads_1_4_16_matched_and_at_head_dim_16():
    config = mhjax.load_config("head_size")
    tasks = mhjax.load_config("tasks")
    assert config.model.to_dict() == tasks.model.to_dict() and config.data.to_dict() == tasks.data.to_dict()
    assert config.train.steps == 1000 and tuple(config.sweep.seed) == (0, 1, 2)
    experiment = make_experiment(config)
    names = [m.name for m in experiment.members]
    # H = 4 at head_dim 16 is the matched model (64 / 4 = 16): skipped, trained once as matched
    assert len(names) == 3 * (2 * 3 - 1) * 3 and "sorting-h16-s2" in names and "recall-d16-h16-s0" in names
    assert "recall-h4-s0" in names and not any(n.startswith("recall-d16-h4") for n in names)
    # attention width 64 under parameter matching, 16 x H at head_dim 16
    groups = {g.name: sorted({experiment.members[i]["heads"] for i in g.members}) for g in experiment.groups}
    assert groups == {"a16": [1], "a64": [1, 4, 16], "a256": [16]}
    for member in experiment.members:
        width = 64 if member.hparams["head_dim"] is None else 16 * member["heads"]
        assert experiment.member_info(member)["params"] == hand_count(64, 2, 128, 32, 32, width), member.name


def test_the_table_gives_each_seeds_first_step_at_99_percent_and_the_population_std():
    from head_size_table import first_at, markdown

    assert first_at([0, 50, 100, 150], [0.5, 0.989, 0.99, 1.0]) == 100
    assert first_at([0, 50], [0.5, 0.98]) is None
    member = dict(params=72864, gflop_per_step=0.44)
    groups = {
        ("recall", 16, 4): [{**member, "eval_accuracy": a, "reached": r} for a, r in ((1.0, 200), (0.98, None))],
        ("recall", None, 4): [{**member, "eval_accuracy": 1.0, "reached": 150}],
    }
    lines = markdown(groups).splitlines()
    assert lines[2] == "| recall | matched (64 / H) | 4 | 1 | 72,864 | 0.440 | 100.0 ± 0.0 | 150 |"
    assert lines[3] == "| recall | 16 | 4 | 2 | 72,864 | 0.440 | 99.0 ± 1.0 | 200, - |"


def test_the_table_fills_a_skipped_fixed_size_point_with_the_matched_model_of_that_size():
    from head_size_table import markdown, shared

    member = dict(params=72864, gflop_per_step=0.44, eval_accuracy=1.0, reached=150)
    groups = {
        ("recall", None, 4): [member],
        ("recall", None, 1): [{**member, "reached": 100}],
        ("recall", 16, 1): [{**member, "reached": 300}],
    }
    filled = shared(groups, 64)
    assert set(filled) == set(groups) | {("recall", 16, 4)}  # 64 / 1 = 64 is no fixed size here
    assert filled[("recall", 16, 4)] == [{**member, "head_dim": 16, "same_as": "matched"}]
    assert "| recall | 16 (= matched) | 4 | 1 | 72,864 | 0.440 | 100.0 ± 0.0 | 150 |" in markdown(filled).splitlines()
