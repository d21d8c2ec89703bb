"""Imports run one way: config, io -> data, models -> analysis -> plotting -> train -> plan ->
experiments -> workflows -> commands, api -> cli. Every import is read from the source (ast), inside functions too."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mhjax"
LAYERS = {
    "config": 0,
    "cache_dir": 0,
    "io": 1,
    "data": 2,
    "models": 2,
    "analysis": 3,
    "plotting": 4,
    "train": 5,
    "plan": 6,  # how a sweep runs: reads the experiments' plain shapes, hands the trainer its Plan
    "experiments": 7,
    "workflows": 8,  # what the entry points do, once: commands and api both call it
    "commands": 9,
    "api": 9,
    "cli": 10,
    "__main__": 11,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The mhjax modules ``path`` imports (``from mhjax.x import y`` counts y when it is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("mhjax"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("mhjax") and node.level == 0:
            for alias in node.names:
                candidate = f"{node.module}.{alias.name}"
                is_module = (PACKAGE.parent / Path(*candidate.split("."))).with_suffix(".py").exists()
                found.add(candidate if is_module else node.module)
    return found


def layer(module: str) -> int | None:
    """The layer of an mhjax module; None for the package root (mhjax/__init__: the version only)."""
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 else None


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    return {module_name(p): imports(p) for p in package.rglob("*.py")}


def upward_edges(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for source, targets in edges.items():
        for target in targets:
            if layer(source) is not None and layer(target) is not None and layer(target) > layer(source):
                bad.append(f"{source} -> {target}")
    return sorted(bad)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected set of more than one module (Tarjan), and self-imports."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in edges.get(node, ()):
            if target not in edges:
                continue
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_every_package_folder_has_a_layer():
    for path in PACKAGE.iterdir():
        if path.name.startswith("_") and path.name != "__main__.py":
            continue
        if path.is_dir() or path.suffix == ".py":
            assert path.stem in LAYERS, f"{path.name}: add it to the layer list in tests/test_layering.py"


def test_imports_only_run_left():
    assert upward_edges(graph()) == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_the_checks_catch_the_old_circle_reintroduced():
    """The circle this layout removed: train/loop -> io/tensorboard -> analysis (attention images)
    -> train/loop (the workdir's Sweep). Put back, both checks fail."""
    edges = graph()
    assert "mhjax.io.tensorboard" in edges["mhjax.train.loop"]
    edges["mhjax.io.tensorboard"] = edges["mhjax.io.tensorboard"] | {"mhjax.analysis.metrics"}
    edges["mhjax.analysis.metrics"] = edges["mhjax.analysis.metrics"] | {"mhjax.train.loop"}
    assert upward_edges(edges) == [
        "mhjax.analysis.metrics -> mhjax.train.loop",
        "mhjax.io.tensorboard -> mhjax.analysis.metrics",
    ]
    assert cycles(edges) == [["mhjax.analysis.metrics", "mhjax.io.tensorboard", "mhjax.train.loop"]]


def test_a_same_layer_circle_is_a_cycle():
    edges = {"mhjax.data.a": {"mhjax.models.b"}, "mhjax.models.b": {"mhjax.data.a"}}
    assert upward_edges(edges) == [] and cycles(edges) == [["mhjax.data.a", "mhjax.models.b"]]


# Rules beyond the layer order (issue 31): pairs of rooms that must not meet although the order allows it.
FORBIDDEN = {
    "models": ("io",),  # a model knows no files: the cache folder is mhjax/cache_dir.py
    "experiments": ("plotting",),  # an experiment hands data; the trainer and workflows draw it
}
ALLOWED: set[str] = set()  # modules exempt from FORBIDDEN (none)
MAX_LINES = 400  # each module owns one concern
LONG_MODULES: set[str] = set()  # modules exempt from MAX_LINES (none)


def room(module: str) -> str | None:
    """The top-level folder or module of an mhjax module (None for the package root)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def forbidden_edges(edges: dict[str, set[str]]) -> list[str]:
    return sorted(
        f"{source} -> {target}"
        for source, targets in edges.items()
        if source not in ALLOWED
        for target in targets
        if room(target) in FORBIDDEN.get(room(source), ())
    )


def test_models_import_no_io_and_experiments_no_plotting():
    assert forbidden_edges(graph()) == []


def test_the_forbidden_pairs_are_caught():
    edges = {"mhjax.models.cpu_attention": {"mhjax.io.compile_cache"}, "mhjax.experiments.x": {"mhjax.plotting.y"}}
    assert forbidden_edges(edges) == [
        "mhjax.experiments.x -> mhjax.plotting.y",
        "mhjax.models.cpu_attention -> mhjax.io.compile_cache",
    ]


def test_no_module_over_400_lines():
    long = {
        module_name(p): n
        for p in PACKAGE.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_LINES and module_name(p) not in LONG_MODULES
    }
    assert long == {}


def test_the_two_entry_points_meet_in_workflows_only():
    """The command line's commands and the Python API (every module of mhjax/api/) share one layer
    below them (workflows/): neither imports the other."""
    edges = graph()
    assert {"mhjax.api", "mhjax.api.run", "mhjax.api.wording"} <= set(edges)
    assert not [t for s, ts in edges.items() if room(s) == "api" for t in ts if room(t) == "commands"]
    assert not [t for s, ts in edges.items() if room(s) == "commands" for t in ts if room(t) == "api"]
