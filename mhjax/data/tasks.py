"""Sequence tasks as plug-ins: a task is a pure function of one PRNG key.

``sample(key, length, vocab_size) -> (inputs, targets, weights)``: three arrays of shape
(length,), dtypes int32, int32 and float32; ``weights`` says which positions count in the
loss and the accuracy. A task is registered by name with ``@mhjax.task("name")`` or
``mhjax.register_task(name, sample)``, from a config file or any module it imports, and a
config's ``sweep.task`` lists registered names.

Optional forms, for speed and for analysing given tokens:
- ``batch(key, num, length, vocab_size)``: the same three arrays with a leading (num,) axis
  (default: sequence i drawn by ``sample`` from ``fold_in(key, i)``);
- ``targets(tokens)``: targets from tokens (..., T) -> (..., T), every position weighted;
  such a task can be analysed on given sequences (``mhjax analyze --sequences``).

Each task remembers where it came from (its ``source``: the config file, or the module and
function), which W/mhjax.json records so that later commands can register it again.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.config import CONFIG_MODULE, ConfigError, exec_config_file


class Batch(NamedTuple):
    """(..., T) inputs (int32), targets (int32) and weights (float32)."""

    inputs: Any
    targets: Any
    weights: Any


@dataclasses.dataclass(frozen=True)
class Task:
    name: str
    sample: Callable  # (key, length, vocab_size) -> (inputs, targets, weights), each (T,)
    batch: Callable | None = None  # (key, num, length, vocab_size) -> the same with a leading (num,) axis
    targets: Callable | None = None  # tokens (..., T) -> targets (..., T); every position weighted
    source: dict = dataclasses.field(default_factory=dict)  # {"module"|"config": ..., "function": ...}

    def draw(self, key, num: int, length: int, vocab_size: int) -> Batch:
        """``num`` sequences from ``key`` (the batched form when the task gives one)."""
        if self.batch is not None:
            return Batch(*self.batch(key, num, length, vocab_size))
        return self.dataset(key, jnp.arange(num), length, vocab_size)

    def dataset(self, dataset_key, indices, length: int, vocab_size: int) -> Batch:
        """Sequences of a fixed dataset by index: row i is sample(fold_in(dataset_key, i)) alone."""
        return Batch(*jax.vmap(lambda i: self.sample(jax.random.fold_in(dataset_key, i), length, vocab_size))(indices))

    def label(self) -> str:
        where = self.source.get("config") or self.source.get("module", "?")
        return f"{where}:{self.source.get('function', '?')}"


_REGISTRY: dict[str, Task] = {}
_CHECKED: set[tuple] = set()  # (name, identity, length, vocab) that passed check_task


def _source(fn) -> dict:
    """Where ``fn`` was defined: a config file (loaded by path) or an importable module."""
    module_name = getattr(fn, "__module__", None) or "__main__"
    path = getattr(sys.modules.get(module_name), "__file__", None) or getattr(fn, "__globals__", {}).get("__file__")
    function = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
    if module_name == CONFIG_MODULE and path:
        return {"config": os.path.abspath(path), "function": function}
    source = {"module": module_name, "function": function}
    if path:
        source["file"] = os.path.abspath(path)
    return source


def register_task(name: str, sample: Callable, *, batch=None, targets=None) -> Task:
    """Register ``sample`` (and its optional batched and targets forms) under ``name``.

    Registering the same module and function again (a notebook re-running a config file)
    replaces it; another function under a taken name is a ConfigError."""
    if not isinstance(name, str) or not name or any(c in name for c in "/. \t\n"):
        raise ConfigError(f"task name: must be a non-empty string without '/', '.' or spaces, got {name!r}")
    if not callable(sample):
        raise ConfigError(f"task {name!r}: sample must be a function (key, length, vocab_size), got {sample!r}")
    task = Task(name, sample, batch, targets, _source(sample))
    old = _REGISTRY.get(name)
    if old is not None and _identity(old) != _identity(task):
        raise ConfigError(f"task {name!r}: already registered by {old.label()}; {task.label()} needs another name")
    _REGISTRY[name] = task
    return task


def task(name: str, *, batch=None, targets=None):
    """Decorator: ``@mhjax.task("name")`` above ``def sample(key, length, vocab_size)``."""

    def register(sample):
        register_task(name, sample, batch=batch, targets=targets)
        return sample

    return register


def _identity(task: Task) -> tuple:
    return task.source.get("config") or task.source.get("module"), task.source.get("function")


def registered() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def get_task(name: str, field: str = "config.sweep.task") -> Task:
    if name not in _REGISTRY:
        raise ConfigError(f"{field}: unknown task {name!r} (registered: {', '.join(registered())})")
    return _REGISTRY[name]


# --------------------------------------------------------------------------- #
# Checks run before anything compiles
# --------------------------------------------------------------------------- #
def check_task(name: str, length: int, vocab_size: int, field: str = "config.sweep.task") -> Task:
    """The registered task ``name`` after checking its sample on a few keys: shapes and dtypes,
    tokens in range, a function of its key, some positive weight. Raises ConfigError."""
    t = get_task(name, field)
    memo = (name, _identity(t), length, vocab_size)
    if memo in _CHECKED:
        return t
    where = f"{field}: task {name!r} ({t.label()})"
    want = f"(inputs, targets, weights) of shape ({length},), dtypes int32, int32, float32"
    key = jax.random.PRNGKey(0)
    try:
        shapes = jax.eval_shape(lambda k: t.sample(k, length, vocab_size), key)
    except Exception as exc:
        raise ConfigError(f"{where}: sample(key, {length}, {vocab_size}) failed: {_one_line(exc)}") from None
    _check_shapes(where, "sample", shapes, (length,), want)
    if t.batch is not None:
        try:
            shapes = jax.eval_shape(lambda k: t.batch(k, 3, length, vocab_size), key)
        except Exception as exc:
            raise ConfigError(f"{where}: batch(key, 3, {length}, {vocab_size}) failed: {_one_line(exc)}") from None
        _check_shapes(where, "batch", shapes, (3, length), want.replace(f"({length},)", f"(3, {length})"))
    first = [np.asarray(a) for a in t.sample(key, length, vocab_size)]
    again = [np.asarray(a) for a in t.sample(key, length, vocab_size)]
    if any(not np.array_equal(a, b) for a, b in zip(first, again)):
        raise ConfigError(f"{where}: sample is not a function of its key (two calls with one key differ)")
    draws = [first] + [[np.asarray(a) for a in t.sample(jax.random.PRNGKey(s), length, vocab_size)] for s in (1, 2)]
    for inputs, targets, weights in draws:
        for label, tokens in (("inputs", inputs), ("targets", targets)):
            if tokens.min() < 0 or tokens.max() >= vocab_size:
                raise ConfigError(
                    f"{where}: {label} must be tokens in [0, {vocab_size - 1}], "
                    f"got values in [{tokens.min()}, {tokens.max()}]"
                )
        if not np.all(np.isfinite(weights)) or weights.min() < 0:
            raise ConfigError(f"{where}: weights must be finite and >= 0")
    if all(not np.any(w > 0) for _, _, w in draws):
        raise ConfigError(f"{where}: weights are all zero: no position counts in the loss")
    if t.targets is not None:
        try:
            shape = jax.eval_shape(t.targets, jax.ShapeDtypeStruct((2, length), jnp.int32))
        except Exception as exc:
            raise ConfigError(f"{where}: targets(tokens) failed: {_one_line(exc)}") from None
        if getattr(shape, "shape", None) != (2, length) or shape.dtype != jnp.int32:
            raise ConfigError(f"{where}: targets(tokens) must return int32 of the tokens' shape (2, {length})")
    _CHECKED.add(memo)
    return t


def _check_shapes(where: str, form: str, shapes, shape: tuple, want: str) -> None:
    ok = isinstance(shapes, (tuple, list)) and len(shapes) == 3
    got = None
    if ok:
        got = [(tuple(getattr(a, "shape", ())), str(getattr(a, "dtype", type(a).__name__))) for a in shapes]
        ok = got == [(shape, "int32"), (shape, "int32"), (shape, "float32")]
    if not ok:
        described = ", ".join(f"{s} {d}" for s, d in got) if got else type(shapes).__name__
        raise ConfigError(f"{where}: {form} must return {want}; got {described}")


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


# --------------------------------------------------------------------------- #
# Finding a plug-in again from its recorded source (W/mhjax.json)
# --------------------------------------------------------------------------- #
def sources(names) -> dict[str, dict]:
    """{name: source} of registered tasks, for W/mhjax.json."""
    return {name: dict(get_task(name).source) for name in names}


def restore(recorded: dict, where: str) -> None:
    """Register again the tasks ``recorded`` ({name: source}, from ``where``) that are not
    registered in this process: run the config file, or import the module (from its file
    when its name no longer imports). A source that is gone is a one-line ConfigError."""
    for name, source in (recorded or {}).items():
        if name in _REGISTRY or not isinstance(source, dict):
            continue
        if source.get("config"):
            _run_config_file(name, source["config"], where)
        elif source.get("module") and source["module"] != "__main__":
            _import_module(name, source, where)
        if name not in _REGISTRY:
            origin = source.get("config") or source.get("module", "?")
            hint = "; register it again first" if source.get("module") == "__main__" else ""
            raise ConfigError(
                f"task {name!r}: {origin} (recorded in {where}) no longer registers it "
                f"(function {source.get('function', '?')}){hint}"
            )


def _run_config_file(name: str, path: str, where: str) -> None:
    if not os.path.isfile(path):
        raise ConfigError(f"task {name!r}: its config file {path} (recorded in {where}) is gone")
    try:
        exec_config_file(path)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"task {name!r}: cannot load its config file {path}: {_one_line(exc)}") from None


def _import_module(name: str, source: dict, where: str) -> None:
    module_name, path = source["module"], source.get("file")
    try:
        importlib.import_module(module_name)
        return
    except ImportError:
        pass
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"task {name!r}: importing {module_name} failed: {_one_line(exc)}") from None
    if not path or not os.path.isfile(path):
        raise ConfigError(f"task {name!r}: its module {module_name} ({path or 'no file'}, recorded in {where}) is gone")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except ConfigError:
        raise
    except Exception as exc:
        del sys.modules[module_name]
        raise ConfigError(f"task {name!r}: cannot load its module {path}: {_one_line(exc)}") from None
