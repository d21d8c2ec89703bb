"""The experiment contract (mhjax/experiments/base.py): both experiments implement it, the hooks'
defaults are no-ops, and the generic code never asks what kind of experiment it runs."""

import ast
from pathlib import Path

import pytest

from mhjax.experiments import make_experiment
from mhjax.experiments.base import Experiment
from mhjax.train.engine import Program
from tests.conftest import tiny_sequence_config

PACKAGE = Path(__file__).resolve().parents[1] / "mhjax"


def test_base_hooks_are_no_ops_and_required_methods_are_abstract():
    base = Experiment()
    assert base.extra_results(None, None) == {} and base.metric_tags() == [] and base.images({}, 0) == {}
    assert base.finalize("unused", {}) is None and base.analyzable is False and base.metadata() == {}
    for method in ("programs", "member_constants", "member_info"):
        with pytest.raises(NotImplementedError):
            getattr(base, method)(*([None] * (2 if method == "programs" else 1)))


def test_the_sequence_experiment_meets_the_contract():
    experiment = make_experiment(tiny_sequence_config())
    assert isinstance(experiment, Experiment) and experiment.analyzable
    programs = experiment.programs("grouped", "cpu")
    assert all(isinstance(p, Program) for p in programs)
    assert sorted(i for p in programs for i in p.members) == list(range(len(experiment.members)))
    assert "analysis/layer0/mixing_time" in experiment.metric_tags()
    assert experiment.describe("cpu")[0].startswith("strategy: grouped -> 2 program(s)")


def test_no_kind_branches_outside_experiments():
    """`experiment.kind == ...` belongs to the experiment's own code, never to the generic modules."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "experiments" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Attribute) and node.left.attr == "kind":
                offenders.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("hasattr", "getattr"):
                if node.args and getattr(node.args[0], "id", None) == "experiment":
                    offenders.append(f"{path.name}:{node.lineno}")
    assert offenders == []
