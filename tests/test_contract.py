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
    assert base.figures({}) == [] and base.analyzable is False and base.metadata() == {}
    for method in ("layout", "member_constants", "member_info"):
        with pytest.raises(NotImplementedError):
            getattr(base, method)(*([None] * (3 if method == "layout" else 1)))


def test_the_sequence_experiment_meets_the_contract():
    experiment = make_experiment(tiny_sequence_config())
    assert isinstance(experiment, Experiment) and experiment.analyzable
    programs = experiment.programs("grouped", "cpu")
    assert all(isinstance(p, Program) for p in programs)
    assert sorted(i for p in programs for i in p.members) == list(range(len(experiment.members)))
    assert "analysis/layer0/mixing_time" in experiment.metric_tags()
    assert experiment.plan("cpu").lines()[0].startswith("strategy: grouped -> 2 program(s)")


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


# ---------------------------------------------------------------------- #
# Contracts as types: Program by field name, recipes only through the Recipe protocol
# ---------------------------------------------------------------------- #
ROOT = PACKAGE.parent
ENGINE = PACKAGE / "train" / "engine.py"


def _programs(node) -> bool:
    """``x.programs``, ``x.programs(...)`` or a name ``programs``: a list of Programs."""
    if isinstance(node, ast.Call):
        node = node.func
    return (isinstance(node, ast.Attribute) and node.attr == "programs") or (
        isinstance(node, ast.Name) and node.id == "programs"
    )


def _position(node) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, int) or isinstance(node, ast.Slice)


def _iterations(tree):
    """(target, iterable) of every for loop and comprehension."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)):
            yield node.target, node.iter


def program_by_position(source: str) -> list[int]:
    """Lines that unpack or index a Program by position (``for name, idx, _ in sweep.programs``,
    ``[(name, idx, recipe)] = experiment.programs(...)``, ``programs[0][2]``, ``p[0]``)."""
    tree = ast.parse(source)
    bound, bad = set(), []  # expressions (as source) that hold one Program
    for target, iterable in _iterations(tree):
        if _programs(iterable):
            if isinstance(target, (ast.Tuple, ast.List)):
                bad.append(target.lineno)
            bound.add(ast.unparse(target))
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            value = node.value
            one = (isinstance(value, ast.Subscript) and _programs(value.value) and _position(value.slice)) or (
                isinstance(value, ast.Call)
                and getattr(value.func, "id", None) == "next"
                and any(_programs(iterable) for _, iterable in _iterations(value))
            )
            for target in node.targets:
                if one and isinstance(target, (ast.Tuple, ast.List)):
                    bad.append(node.lineno)
                elif one:
                    bound.add(ast.unparse(target))
                elif _programs(value) and isinstance(target, (ast.Tuple, ast.List)):
                    for element in target.elts:
                        if isinstance(element, (ast.Tuple, ast.List)):
                            bad.append(node.lineno)
                        else:
                            bound.add(ast.unparse(element))
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _position(node.slice):
            inner = node.value
            if ast.unparse(inner) in bound or (
                isinstance(inner, ast.Subscript) and _programs(inner.value) and _position(inner.slice)
            ):
                bad.append(node.lineno)
    return sorted(set(bad))


def recipe_introspection(source: str) -> list[int]:
    """Lines that ask a recipe what it is (``getattr``/``hasattr``/``isinstance`` on a recipe) or
    define ``__getattr__`` on a class (an object that answers any attribute name; a module's
    ``__getattr__``, mhjax/__init__.py's lazy imports of a fixed list of names, is not one)."""
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "hasattr", "isinstance"):
            if node.args and "recipe" in ast.unparse(node.args[0]).lower():
                bad.append(node.lineno)
        if isinstance(node, ast.ClassDef):
            bad += [f.lineno for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__getattr__"]
    return bad


BAD_PROGRAM_USES = [
    "for name, idx, _ in sweep.programs:\n    pass",
    "[(name, idx, recipe)] = experiment.programs('auto', 'cpu')",
    "program, idx, _ = sw.programs[0]",
    "r = experiment.programs('auto', 'cpu')[0][2]",
    "out = {n: i for n, i, _ in self.programs}",
    "p = next(p for p in sweep.programs if p.name == 'all')\nx = p[1]",
    "for p in programs:\n    print(p[0])",
]
GOOD_PROGRAM_USES = [
    "for p in sweep.programs:\n    print(p.name, p.members)",
    "[program] = experiment.programs('auto', 'cpu')\nx = program.recipe",
    "p = sweep.programs[0]\nx = p.members[1]",
    "for name, idx in results['programs'].items():\n    pass",
]
BAD_RECIPE_USES = [
    "if getattr(recipe, 'vmap_inside_grad', False): pass",
    "ok = isinstance(program.recipe, Unrolled)",
    "hasattr(r_recipe, 'model')",
    "class A:\n    def __getattr__(self, name):\n        return None",
]


def test_the_checkers_catch_positional_programs_and_recipe_introspection():
    for source in BAD_PROGRAM_USES:
        assert program_by_position(source), source
    for source in GOOD_PROGRAM_USES:
        assert program_by_position(source) == [], source
    for source in BAD_RECIPE_USES:
        assert recipe_introspection(source), source
    assert recipe_introspection("x = recipe.model.layout\ny = getattr(state, 'hyperparams', None)") == []


def test_programs_are_read_by_field_name_and_recipes_only_through_their_protocol():
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py"), *(ROOT / "tests").rglob("*.py")]
    positional = [f"{p.relative_to(ROOT)}:{line}" for p in sources for line in program_by_position(p.read_text())]
    assert positional == []
    # tests may check which type a strategy chose; the package and benchmarks may not
    introspecting = [
        f"{p.relative_to(ROOT)}:{line}"
        for p in [*PACKAGE.rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]
        if p != ENGINE
        for line in recipe_introspection(p.read_text())
    ]
    assert introspecting == []


def test_experiments_get_the_trainer_state_through_the_contract():
    """No experiment reads the trainer's Sweep (its programs, constants or recorded losses)."""
    offenders = []
    for path in (PACKAGE / "experiments").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "sweep":
                offenders.append(f"{path.name}:{node.lineno} sweep.{node.attr}")
    assert offenders == []


def test_the_silent_writers_have_exactly_the_writers_methods():
    from mhjax.io.tensorboard import MemberWriters, NoWriters

    public = lambda cls: {n for n in vars(cls) if not n.startswith("_")}  # noqa: E731
    assert public(NoWriters) == public(MemberWriters)
    with pytest.raises(AttributeError):
        NoWriters().add_scalar  # noqa: B018  a misspelt or unknown method is an error
