"""Loading a config: a file, or a bundled config by name, with overrides; one function for the
command line and the Python API.

Bundled configs live in the checkout's configs/ folder (``CONFIG_DIR``); an installed package
(pip install mhjax, not editable) does not ship them, so there a bundled name does not resolve:
pass the config file's path instead."""

from __future__ import annotations

import glob
import os

import ml_collections

from mhjax.config import ConfigError, apply_overrides, load_config_file
from mhjax.experiments import make_experiment, override_defaults

# configs/ of the checkout this package sits in (absent in an installed, non-editable package)
CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "configs")


def config_path(path_or_name) -> str:
    """``path_or_name`` if it is a file; else a bundled config's path (``"quick"`` or
    ``"quick.py"``: configs/quick.py of a checkout). Neither: ConfigError naming --config."""
    path = os.fspath(path_or_name)
    if os.path.isfile(path):
        return path
    bundled = os.path.join(CONFIG_DIR, path if path.endswith(".py") else f"{path}.py")
    if os.path.sep not in path and os.path.isfile(bundled):
        return bundled
    hint = "" if os.path.sep in path or os.path.isdir(CONFIG_DIR) else " (bundled names resolve in a checkout only)"
    raise ConfigError(f"--config: file not found: {path}{hint}")


def load_config(path_or_name, overrides: dict | None = None, *, validate: bool = True) -> ml_collections.ConfigDict:
    """A config file, or a bundled config by name, with ``overrides`` {dotted field: value}
    (values as typed on the command line, or Python values: ``{"sweep.heads": (1, 4)}``).
    ``validate``: make the experiment now, before anything compiles (the command line validates
    later, after jax.distributed starts: validating a task runs it, which starts the backend)."""
    config = load_config_file(config_path(path_or_name))
    if overrides:
        text = {field: value if isinstance(value, str) else repr(value) for field, value in overrides.items()}
        config = apply_overrides(config, text, override_defaults(config))
    if validate:
        make_experiment(config)
    return config


def bundled_configs() -> list[tuple[str, str]]:
    """[(path, the first line of its docstring)] of the bundled configs, by name."""
    return [(path, _summary(path)) for path in sorted(glob.glob(os.path.join(CONFIG_DIR, "*.py")))]


def _summary(path: str) -> str:
    with open(path) as f:
        source = f.read().lstrip()
    return source[3:].split('"""', 1)[0].strip().splitlines()[0] if source.startswith('"""') else ""
