"""Sequence tasks as plug-ins: a task is a pure function of one PRNG key.

``sample(key, length, vocab_size) -> (inputs, targets, weights)``: three arrays of shape
(length,), dtypes int32, int32 and float32; ``weights`` says which positions count in the
loss and the accuracy. A task is registered by name with ``@mhjax.task("name")`` or
``mhjax.register_task(name, sample)``, from a config file or any module it imports, and a
config's ``sweep.task`` lists registered names.

Optional forms, for speed and for analysing given tokens:
- ``batch(key, num, length, vocab_size)``: the same three arrays with a leading (num,) axis
  (default: sequence i drawn by ``sample`` from ``fold_in(key, i)``);
- ``targets(tokens)``: targets from tokens (..., T) -> (..., T), every position weighted, or
  ``(targets, weights)``, both (..., T), where positions the task leaves undefined (weight 0)
  should not count; such a task can be analysed on given sequences (``mhjax analyze
  --sequences``, ``run.forward(member, tokens)``);
- ``heldout(key, num, length, vocab_size)``: held-out sequences, drawn apart from the training
  ones (evaluation and analysis: the test set; default: ``batch``'s draws from the evaluation key);
- ``validation(key, num, length, vocab_size)``: the validation set, apart from ``heldout``'s
  (default: the heldout form, else ``batch``, from a key of its own: disjoint where they draw
  fresh sequences; a task whose held-out sequences come from a fixed pool gives this form, as
  the text task does: experiments/heldout_sets.py);
- ``bind(config) -> Task``: a task whose forms read the config's data (the text task's corpus,
  data/text.py), bound per config by experiments/task_params.bound_tasks.

Parameters: ``@mhjax.task("recall", params={"pairs": None})`` above ``def sample(key, length,
vocab_size, pairs)`` declares a parameter with its default; a config sets it in
``config.task_params`` (a tuple sweeps it) and every form then receives it as a keyword.
``Task.with_params`` binds values: each (task, values) is its own sampler.

Each task remembers where it came from (its ``source``: the config file, or the module and
function, and the file's sha256 for a plug-in), which W/mhjax.json records so that later
commands can register it again, and tell when its file changed since training.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from mhjax.config import ConfigError
from mhjax.data import python_corpora
from mhjax.data.plugins import file_sha256, import_module, pinned, run_config_file, source_of


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
    targets: Callable | None = None  # tokens (..., T) -> targets (..., T) or (targets, weights)
    source: dict = dataclasses.field(default_factory=dict)  # {"module"|"config": ..., "function": ...}
    params: dict = dataclasses.field(default_factory=dict)  # declared parameters and their defaults
    values: dict = dataclasses.field(default_factory=dict)  # bound values (with_params)
    heldout: Callable | None = None  # (key, num, length, vocab_size) -> held-out sequences (the test set)
    validation: Callable | None = None  # the same, apart from heldout's (text: other blocks; data/text.py)
    bind: Callable | None = None  # config -> the Task over the config's data
    facts: dict = dataclasses.field(default_factory=dict)  # a bound task's facts, in its members' results
    host_reads: bool = False  # its training forms read the host (text above its on-device limit): prefetched per chunk

    @property
    def kwargs(self) -> dict:
        """The parameters every form receives: the defaults, with the bound values over them."""
        return {**self.params, **self.values}

    def with_params(self, values: dict | None, field: str = "config.task_params") -> Task:
        """This task with ``values`` bound ({param: value}; unknown names: ConfigError)."""
        values = dict(values or {})
        for name, value in values.items():
            if name not in self.params:
                declared = ", ".join(self.params) or "none"
                raise ConfigError(
                    f"{field}.{self.name}.{name}: task {self.name!r} has no such parameter (its parameters: {declared})"
                )
            if not isinstance(value, PARAM_TYPES):
                raise ConfigError(f"{field}.{self.name}.{name}: must be a number, string, bool or None, got {value!r}")
        return dataclasses.replace(self, values=values)

    def call_sample(self, key, length: int, vocab_size: int):
        return self.sample(key, length, vocab_size, **self.kwargs)

    def call_targets(self, tokens):
        """The targets form's own result: targets, or (targets, weights)."""
        return self.targets(tokens, **self.kwargs)

    def targets_and_weights(self, tokens):
        """(targets, weights) of ``tokens`` (..., T) by the targets form: its weights where it
        gives them, else 1 at every position (float32)."""
        out = self.call_targets(tokens)
        if isinstance(out, (tuple, list)) and len(out) == 2:
            return out[0], jnp.asarray(out[1], jnp.float32)
        return out, jnp.ones(jnp.shape(tokens), jnp.float32)

    def draw(self, key, num: int, length: int, vocab_size: int) -> Batch:
        """``num`` sequences from ``key`` (the batched form when the task gives one)."""
        if self.batch is not None:
            return Batch(*self.batch(key, num, length, vocab_size, **self.kwargs))
        return self.dataset(key, jnp.arange(num), length, vocab_size)

    def draw_eval(self, key, num: int, length: int, vocab_size: int) -> Batch:
        """``num`` held-out sequences from ``key``: the heldout form, else ``draw``."""
        if self.heldout is not None:
            return Batch(*self.heldout(key, num, length, vocab_size, **self.kwargs))
        return self.draw(key, num, length, vocab_size)

    def draw_validation(self, key, num: int, length: int, vocab_size: int) -> Batch:
        """``num`` validation sequences from ``key`` (a key apart from the evaluation key): the
        validation form, else ``draw_eval``'s draws (generated tasks: a fresh draw)."""
        if self.validation is not None:
            return Batch(*self.validation(key, num, length, vocab_size, **self.kwargs))
        return self.draw_eval(key, num, length, vocab_size)

    def dataset(self, dataset_key, indices, length: int, vocab_size: int) -> Batch:
        """Sequences of a fixed dataset by index: row i is sample(fold_in(dataset_key, i)) alone."""
        sample = lambda i: self.call_sample(jax.random.fold_in(dataset_key, i), length, vocab_size)  # noqa: E731
        return Batch(*jax.vmap(sample)(indices))

    def label(self) -> str:
        where = self.source.get("config") or self.source.get("module", "?")
        bound = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"{where}:{self.source.get('function', '?')}{bound}"


PARAM_TYPES = (bool, int, float, str, type(None))  # a task parameter's value (a tuple in a config sweeps it)


_REGISTRY: dict[str, Task] = {}


def register_task(
    name: str,
    sample: Callable,
    *,
    batch=None,
    targets=None,
    params: dict | None = None,
    heldout=None,
    bind=None,
    validation=None,
) -> Task:
    """Register ``sample`` (and its optional batched, targets, heldout, validation and bind forms) under
    ``name``; ``params``: {parameter: default}, passed to every form as keywords.

    Registering the same module and function again (a notebook re-running a config file)
    replaces it; another function under a taken name is a ConfigError."""
    if not isinstance(name, str) or not name or any(c in name for c in "/. \t\n"):
        raise ConfigError(f"task name: must be a non-empty string without '/', '.' or spaces, got {name!r}")
    if not callable(sample):
        raise ConfigError(f"task {name!r}: sample must be a function (key, length, vocab_size), got {sample!r}")
    params = _check_params(name, sample, params)
    task = Task(
        name, sample, batch, targets, source_of(sample), params, heldout=heldout, validation=validation, bind=bind
    )
    old = _REGISTRY.get(name)
    if old is not None and _identity(old) != _identity(task):
        raise ConfigError(f"task {name!r}: already registered by {old.label()}; {task.label()} needs another name")
    _REGISTRY[name] = task
    return task


def task(name: str, *, batch=None, targets=None, params: dict | None = None):
    """Decorator: ``@mhjax.task("name")`` above ``def sample(key, length, vocab_size)``; with
    ``params={"pairs": None}`` above ``def sample(key, length, vocab_size, pairs)``."""

    def register(sample):
        register_task(name, sample, batch=batch, targets=targets, params=params)
        return sample

    return register


RESERVED = ("task", "heads", "seed", "learning_rate", "key", "length", "vocab_size")  # not a parameter's name


def _check_params(name: str, sample, params) -> dict:
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise ConfigError(f"task {name!r}: params must be a dict {{parameter: default}}, got {params!r}")
    try:
        accepted = inspect.signature(sample).parameters
    except (TypeError, ValueError):  # a builtin or C function: no signature to check against
        accepted = None
    takes_any = accepted is not None and inspect.Parameter.VAR_KEYWORD in {p.kind for p in accepted.values()}
    for param, default in params.items():
        if not isinstance(param, str) or not param.isidentifier() or param in RESERVED:
            raise ConfigError(
                f"task {name!r}: parameter {param!r} must be an identifier other than {', '.join(RESERVED)}"
            )
        if not isinstance(default, PARAM_TYPES):
            raise ConfigError(
                f"task {name!r}: parameter {param!r}'s default must be a number, string, bool or None, got {default!r}"
            )
        if accepted is not None and not takes_any and param not in accepted:
            raise ConfigError(f"task {name!r}: sample takes no parameter {param!r} (declared in params)")
    return dict(params)


def _identity(task: Task) -> tuple:
    return task.source.get("config") or task.source.get("module"), task.source.get("function")


def registered() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def get_task(name: str, field: str = "config.sweep.task") -> Task:
    if name not in _REGISTRY:
        raise ConfigError(f"{field}: unknown task {name!r} (registered: {', '.join(registered())})")
    return _REGISTRY[name]


# --------------------------------------------------------------------------- #
# Finding a plug-in again from its recorded source (W/mhjax.json)
# --------------------------------------------------------------------------- #
def sources(names, bound=()) -> dict[str, dict]:
    """{name: source} of registered tasks, for W/mhjax.json; a plug-in's (a task defined outside
    mhjax: mhjax's own are pinned by its version) with its file's ``sha256``; a task bound to the
    config's data (``bound``: Tasks) with its ``data`` record (path, size, sha256)."""
    out = {}
    data = {t.name: t.source["data"] for t in bound if "data" in t.source}
    for name in names:
        source = dict(get_task(name).source)
        if name in data:
            source["data"] = data[name]
        out[name] = pinned(source)
    return out


def changed_sources(recorded: dict) -> list[str]:
    """Lines naming each recorded task whose source file, or data file (the text task's corpus),
    changed since training (one that is gone is restore's, or the task's own loading, to report)."""
    out = []
    for name, source in (recorded or {}).items():
        for what, path, want in _recorded_files(source):
            if os.path.isfile(path) and file_sha256(path) != want:
                out.append(f"task {name!r}: its {what} {path} changed since training (sha256 differs)")
    return out


def _recorded_files(source) -> list[tuple[str, str, str]]:
    """(what, path, recorded sha256) of the files a recorded task source pins: a plug-in's source
    file, a task's data file ({"data": {"path", "sha256"}}, data/text.py)."""
    if not isinstance(source, dict):
        return []
    out = []
    path = source.get("config") or source.get("file")
    if source.get("sha256") and path:
        out.append(("source", path, source["sha256"]))
    data = source.get("data")
    if isinstance(data, dict) and data.get("sha256") and data.get("path"):
        if data.get("builtin"):  # builtin:NAME: what this Python builds now (python_corpora.py)
            path = python_corpora.resolve(python_corpora.PREFIX + str(data["builtin"]))[0]
            out.append(
                (f"data file builtin:{data['builtin']} (Python {data.get('python')} at training)", path, data["sha256"])
            )
        else:
            out.append(("data file", data["path"], data["sha256"]))
    return out


def source_hashes(source) -> dict:
    """{"recorded": the source (or data) file's sha256 at training, "current": now (None: the
    file is gone)}; {} for a task with no recorded sha256 (mhjax's own, without data)."""
    files = _recorded_files(source)
    if not files:
        return {}
    _, path, want = files[0]
    return {"recorded": want, "current": file_sha256(path) if os.path.isfile(path) else None}


# What a user does about a task whose source is gone or changed, in the words of the interface
# in use: "cli" (a command's flags) or "python" (the API's arguments).
HOW_TO_REGISTER = {
    "cli": "put its source back, or from Python register it (import or run the code that defines it) "
    "and call mhjax.load(workdir).analyze()",
    "python": "register it in Python first (import or run the code that defines it)",
}
ALLOW_CHANGED = {"cli": "pass --allow-changed-task", "python": "pass allow_changed_task=True"}


def changed_error(changed: list[str], interface: str = "python") -> ConfigError:
    """The one-line refusal of a task whose source file changed since training."""
    return ConfigError(
        f"{changed[0]}; its results may not be what this code computes: {ALLOW_CHANGED[interface]} to go on anyway"
    )


def restore(recorded: dict, where: str, allow_changed: bool | None = None, interface: str = "python") -> None:
    """Register again the tasks ``recorded`` ({name: source}, from ``where``) that are not
    registered in this process: run the config file, or import the module (from its file
    when its name no longer imports). A source that is gone is a one-line ConfigError.
    ``allow_changed=False``: a source file whose sha256 differs from the recorded one is a
    ConfigError too (what analyze does without --allow-changed-task); None: not checked.
    ``interface``: "cli" or "python", whose words the messages use."""
    how = HOW_TO_REGISTER[interface]
    if allow_changed is False:
        changed = changed_sources(recorded)
        if changed:
            raise changed_error(changed, interface)
    for name, source in (recorded or {}).items():
        if name in _REGISTRY or not isinstance(source, dict):
            continue
        if source.get("config"):
            run_config_file(f"task {name!r}", source["config"], where, f"; {how}")
        elif source.get("module") and source["module"] != "__main__":
            import_module(f"task {name!r}", source, where, f"; {how}")
        if name not in _REGISTRY:
            origin = source.get("config") or source.get("module", "?")
            raise ConfigError(
                f"task {name!r}: {origin} (recorded in {where}) no longer registers it "
                f"(function {source.get('function', '?')}); {how}"
            )
