"""Registries of named plug-in functions that a workdir can find again.

A plug-in (a mixture data generator, an attention map phi, a loss, a step rule) is a function
registered under a name, from a config file or any module it imports. Each remembers where it
came from (its ``source``: the config file, or the module and function, and the file's sha256
for one defined outside mhjax); W/mhjax.json records the sources of the plug-ins a run used, so
that a later process (``mhjax.load``, analyze, report) registers them again before it rebuilds
anything of the run, and a resume sees a source that changed (workflows/train.check_sources).

data/tasks.py keeps its own copy of the source bookkeeping for sequence tasks (it predates this
module; both write the same ``source`` records).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys
from typing import Callable

from mhjax.config import CONFIG_MODULE, ConfigError, chained, exec_config_file, user_error


@dataclasses.dataclass(frozen=True)
class Plugin:
    name: str
    fn: Callable
    source: dict  # {"module"|"config": ..., "function": ..., ["file": ...]}
    options: dict = dataclasses.field(default_factory=dict)  # e.g. a loss's exponential_tail

    def label(self) -> str:
        where = self.source.get("config") or self.source.get("module", "?")
        return f"{where}:{self.source.get('function', '?')}"

    def identity(self) -> tuple:
        return self.source.get("config") or self.source.get("module"), self.source.get("function")


def source_of(fn) -> dict:
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


def file_sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def changed_sources(recorded, where: tuple = ()) -> list[str]:
    """Lines naming each plug-in source in ``recorded`` (a part of W/mhjax.json: records with a
    "function" and a "sha256", ``pinned``) whose file's sha256 differs now, found before anything
    runs it again (a file that is gone is ``restore``'s to report)."""
    if not isinstance(recorded, dict):
        return []
    path = recorded.get("config") or recorded.get("file")
    if "function" in recorded and recorded.get("sha256") and path:
        changed = os.path.isfile(path) and file_sha256(path) != recorded["sha256"]
        return [f"{'.'.join(where)}: its source {path} changed since training (sha256 differs)"] if changed else []
    return [line for key, value in recorded.items() for line in changed_sources(value, (*where, str(key)))]


def pinned(source: dict) -> dict:
    """``source`` with its file's ``sha256`` when it is a plug-in's (defined outside mhjax: mhjax's
    own are pinned by its version), so that a later command sees the file changed."""
    path = source.get("config") or source.get("file")
    if path and not _inside_mhjax(path) and os.path.isfile(path):
        return {**source, "sha256": file_sha256(path)}
    return source


def _inside_mhjax(path: str) -> bool:
    return os.path.abspath(path).startswith(os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep)


def one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


class Registry:
    """Plug-ins of one kind (``noun``, e.g. "mixture data") by name."""

    def __init__(self, noun: str):
        self.noun = noun
        self._plugins: dict[str, Plugin] = {}

    def register(self, name: str, fn: Callable, **options) -> Plugin:
        """Register ``fn`` under ``name``. The same module and function again (a notebook
        re-running a config file) replaces it; another function under a taken name is an error."""
        if not isinstance(name, str) or not name or any(c in name for c in "/. \t\n"):
            raise ConfigError(f"{self.noun} name: must be a non-empty string without '/', '.' or spaces, got {name!r}")
        if not callable(fn):
            raise ConfigError(f"{self.noun} {name!r}: must be a function, got {fn!r}")
        plugin = Plugin(name, fn, source_of(fn), dict(options))
        old = self._plugins.get(name)
        if old is not None and old.identity() != plugin.identity():
            raise ConfigError(
                f"{self.noun} {name!r}: already registered by {old.label()}; {plugin.label()} needs another name"
            )
        self._plugins[name] = plugin
        return plugin

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._plugins))

    def get(self, name, field: str) -> Plugin:
        if name not in self._plugins:
            raise ConfigError(f"{field}: unknown {self.noun} {name!r} (registered: {', '.join(self.names())})")
        return self._plugins[name]

    def sources(self, names) -> dict[str, dict]:
        """{name: source} of registered plug-ins, for W/mhjax.json (a plug-in's with its file's sha256)."""
        return {name: pinned(dict(self._plugins[name].source)) for name in names if name in self._plugins}

    def restore(self, recorded: dict | None, where: str) -> None:
        """Register again the plug-ins ``recorded`` ({name: source}, from ``where``) that this
        process lacks: run the config file, or import the module (from its file when its name no
        longer imports). A source that is gone is a one-line ConfigError naming it."""
        for name, source in (recorded or {}).items():
            if name in self._plugins or not isinstance(source, dict):
                continue
            what = f"{self.noun} {name!r}"
            if source.get("config"):
                run_config_file(what, source["config"], where)
            elif source.get("module") and source["module"] != "__main__":
                import_module(what, source, where)
            if name not in self._plugins:
                origin = source.get("config") or source.get("module", "?")
                hint = "; register it again first" if source.get("module") == "__main__" else ""
                raise ConfigError(
                    f"{what}: {origin} (recorded in {where}) no longer registers it "
                    f"(function {source.get('function', '?')}){hint}"
                )


def run_config_file(what: str, path: str, where: str, hint: str = "") -> None:
    """Run a plug-in's recorded config file again (it registers its plug-ins); ``hint``: the way
    out, appended when the file is gone."""
    if not os.path.isfile(path):
        raise ConfigError(f"{what}: its config file {path} (recorded in {where}) is gone{hint}")
    try:
        exec_config_file(path)
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{what}: cannot load its config file {path}: {user_error(exc)}") from chained(exc)


def import_module(what: str, source: dict, where: str, hint: str = "") -> None:
    """Import a plug-in's recorded module again, by name or else from its recorded file."""
    module_name, path = source["module"], source.get("file")
    try:
        importlib.import_module(module_name)
        return
    except ImportError:
        pass
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{what}: importing {module_name} failed: {user_error(exc)}") from chained(exc)
    if not path or not os.path.isfile(path):
        raise ConfigError(f"{what}: its module {module_name} ({path or 'no file'}, recorded in {where}) is gone{hint}")
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except ConfigError:
        raise
    except Exception as exc:
        del sys.modules[module_name]
        raise ConfigError(f"{what}: cannot load its module {path}: {user_error(exc)}") from chained(exc)
