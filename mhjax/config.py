"""Loading ml_collections config files, --config.FIELD=VALUE overrides and validation.

Every problem with a config raises ConfigError("<field>: <what is allowed>"); the
command line prints that one line and exits with status 2 before anything compiles.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
import os
import sys

import ml_collections

CONFIG_MODULE = "mhjax_user_config"  # the module name a config file is loaded under (tasks record it)


class ConfigError(ValueError):
    """A bad config or input; the message is one line naming the field."""


def load_config_file(path: str) -> ml_collections.ConfigDict:
    if not os.path.isfile(path):
        raise ConfigError(f"--config: file not found: {path}")
    try:
        module = exec_config_file(path)
    except Exception as exc:  # a broken config file is bad input, not a crash
        raise ConfigError(f"--config: cannot load {path}: {_one_line(exc)}") from chained(exc)
    if not callable(getattr(module, "get_config", None)):
        raise ConfigError(f"--config: {path} defines no get_config()")
    try:
        config = module.get_config()
    except Exception as exc:
        raise ConfigError(f"--config: get_config() in {path} failed: {_one_line(exc)}") from chained(exc)
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(
            f"--config: get_config() in {path} must return an ml_collections.ConfigDict, got {type(config).__name__}"
        )
    return config


def exec_config_file(path: str):
    """Run the file at ``path`` (any name, not only *.py) as the module CONFIG_MODULE; return it."""
    loader = importlib.machinery.SourceFileLoader(CONFIG_MODULE, os.path.abspath(path))
    spec = importlib.util.spec_from_loader(CONFIG_MODULE, loader)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _one_line(exc: BaseException) -> str:
    return user_error(exc)


def chained(exc: BaseException):
    """What a ConfigError about ``exc`` chains: ``exc`` when MHJAX_TRACEBACK asks for it, else nothing."""
    return exc if traceback_wanted() else None


TRACEBACK_VARIABLE = "MHJAX_TRACEBACK"  # =1: errors from user code keep their traceback (the CLI prints it)


def traceback_wanted() -> bool:
    return os.environ.get(TRACEBACK_VARIABLE, "") not in ("", "0")


def user_error(exc: BaseException, limit: int = 300) -> str:
    """One line about an exception raised in user code (a config file, a task): its type, the
    first line of its message and the file and line in user code where it was raised (the
    innermost frame outside mhjax, JAX, NumPy and the standard library)."""
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
    if len(first) > limit:
        first = first[: limit - 3] + "..."
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    frame = _user_frame(exc)
    if frame is not None:
        text += f" (at {frame.filename}:{frame.lineno}" + (f": {frame.line.strip()}" if frame.line else "") + ")"
    if not traceback_wanted():
        text += f"; {TRACEBACK_VARIABLE}=1 shows the traceback"
    return text


def _user_frame(exc: BaseException):
    import traceback

    library = [os.path.dirname(os.path.abspath(__file__))]  # mhjax
    for name in ("jax", "jaxlib", "numpy", "flax", "optax", "ml_collections"):
        module = sys.modules.get(name)
        if module is not None and getattr(module, "__file__", None):
            library.append(os.path.dirname(os.path.abspath(module.__file__)))
    library.append(os.path.dirname(os.__file__))  # the standard library
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not any(os.path.abspath(f.filename).startswith(root + os.sep) for root in library)
        and not f.filename.startswith("<frozen")
    ]
    return frames[-1] if frames else None


_SPECIAL_NUMBERS = {"inf": float("inf"), "infinity": float("inf"), "nan": float("nan")}


class _Numbers(ast.NodeTransformer):
    """inf, Infinity and nan (any case) as the floats they name, so that every field parses them alike."""

    def visit_Name(self, node):
        value = _SPECIAL_NUMBERS.get(node.id.lower())
        return ast.copy_location(ast.Constant(value), node) if value is not None else node


def _literal(text: str):
    """A Python literal (numbers, strings, tuples, ...; inf and nan too), else the text itself."""
    try:
        tree = _Numbers().visit(ast.parse(text.strip(), mode="eval"))
        return ast.literal_eval(tree)
    except (ValueError, SyntaxError, TypeError, RecursionError):
        return text


NONE_WORDS = ("none", "null", "")  # what an override may write for None, any case


def _names_none(text: str) -> bool:
    return text.strip().lower() in NONE_WORDS


def _parse_value(text: str, current):
    """Parse an override string to the type of the field it replaces (a one-element tuple, as
    "0.1," parses, stands for its element in a field that is not a list)."""
    value = _literal(text)
    if not isinstance(current, (tuple, list)) and isinstance(value, tuple) and len(value) == 1:
        value = value[0]
    if isinstance(current, (tuple, list)):
        if not isinstance(value, (tuple, list)):
            value = (value,)
        return tuple(value)
    if isinstance(current, bool):
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if not isinstance(value, bool):
            raise TypeError("a boolean (true/false)")
        return value
    if isinstance(current, int) and not isinstance(value, bool):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, int):
            raise TypeError("an integer")
        return value
    if isinstance(current, float):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError("a number")
        return float(value)
    if isinstance(current, str):
        return str(text)
    return value


def apply_overrides(
    config: ml_collections.ConfigDict, overrides: dict[str, str], defaults: dict | None = None
) -> ml_collections.ConfigDict:
    """overrides: dotted field -> string value, e.g. {"train.steps": "100"}. ``defaults``
    ({dotted field: default value}, the experiment's table): a field the config leaves out may be
    set too, typed as its default (a field whose default is None takes None, written None, none,
    null or empty, though the file set a value); "<section>.*" admits any new field of that section (parsed as
    a Python literal, e.g. a plug-in's own data field)."""
    config = ml_collections.ConfigDict(config.to_dict())  # copy; keep the caller's untouched
    defaults = defaults or {}
    for field, text in overrides.items():
        parts = field.split(".")
        if parts[0] in OPEN_FIELDS:
            _set_open_field(config, field, parts, text)
            continue
        known = field in defaults or ".".join(parts[:-1] + ["*"]) in defaults
        node = config
        for i, part in enumerate(parts[:-1]):
            if isinstance(node, ml_collections.ConfigDict) and part not in node and known:
                with node.unlocked():
                    node[part] = ml_collections.ConfigDict()
            if not isinstance(node, ml_collections.ConfigDict) or part not in node:
                raise ConfigError(f"config.{field}: unknown field (known here: {_known(node, defaults, parts[:i])})")
            node = node[part]
        last = parts[-1]
        if not isinstance(node, ml_collections.ConfigDict) or (last not in node and not known):
            raise ConfigError(f"config.{field}: unknown field (known here: {_known(node, defaults, parts[:-1])})")
        current = node[last] if last in node else defaults.get(field)
        none_allowed = current is None or (field in defaults and defaults[field] is None)
        if current is None and field in defaults:
            current = defaults[field]
        try:
            # a field whose default is None takes None wherever a file set it (None, none, null, empty)
            value = None if none_allowed and _names_none(text) else _parse_value(text, current)
        except TypeError as exc:
            raise ConfigError(f"config.{field}: expected {exc}, got {text!r}") from None
        with node.unlocked():
            node[last] = value
    return config


# Config fields whose names are the user's (task names, their parameters): an override may
# create them, and its value is taken as written (a tuple, e.g. 4,8, sweeps a task parameter).
OPEN_FIELDS = {"task_params": 2}  # field: how many names below it (task, parameter)


def _set_open_field(config, field: str, parts: list[str], text: str) -> None:
    depth = OPEN_FIELDS[parts[0]]
    if len(parts) != depth + 1 or not all(parts):
        raise ConfigError(f"config.{field}: expected config.{parts[0]}.TASK.PARAMETER=VALUE")
    node = config
    for part in parts[:-1]:
        if part not in node or node[part] is None:
            with node.unlocked():
                node[part] = ml_collections.ConfigDict()
        node = node[part]
        if not isinstance(node, ml_collections.ConfigDict):
            raise ConfigError(f"config.{field}: config.{part} is not a dict")
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        value = text
    with node.unlocked():
        if parts[-1] in node:  # a new value may have another type (8 -> (4, 8))
            del node[parts[-1]]
        node[parts[-1]] = tuple(value) if isinstance(value, list) else value


def _known(node, defaults: dict, prefix: list[str]) -> str:
    names = set(node.keys()) if isinstance(node, ml_collections.ConfigDict) else set()
    start = ".".join(prefix) + "." if prefix else ""
    names |= {f[len(start) :].split(".")[0] for f in defaults if f.startswith(start) and not f.endswith("*")}
    return ", ".join(sorted(names))


def split_overrides(argv: list[str]) -> tuple[list[str], dict[str, str]]:
    """Pull --config.FIELD=VALUE (or --config.FIELD VALUE) out of argv."""
    rest, overrides = [], {}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg.startswith("--config."):
            body = arg[len("--config.") :]
            if "=" in body:
                field, value = body.split("=", 1)
            elif i + 1 < len(argv):
                field, value = body, argv[i + 1]
                i += 1
            else:
                raise ConfigError(f"config.{body}: missing value (use --config.{body}=VALUE)")
            overrides[field] = value
        else:
            rest.append(arg)
        i += 1
    return rest, overrides


# ---- validation helpers: each raises ConfigError naming the field ----


def require_positive(config, field: str, kind=(int, float)):
    value = _get(config, field)
    if isinstance(value, bool) or not isinstance(value, kind) or value <= 0:
        raise ConfigError(f"config.{field}: must be a positive {'integer' if kind is int else 'number'}, got {value!r}")


def require_nonneg_int(config, field: str):
    value = _get(config, field)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"config.{field}: must be a non-negative integer, got {value!r}")


def require_choice(config, field: str, allowed):
    value = _get(config, field)
    if value not in allowed:
        raise ConfigError(f"config.{field}: must be one of {', '.join(map(str, allowed))}; got {value!r}")


def require_nonempty_tuple(config, field: str):
    value = _get(config, field)
    if not isinstance(value, (tuple, list)) or len(value) == 0:
        raise ConfigError(f"config.{field}: must be a non-empty list, got {value!r}")
    return tuple(value)


def require_range(config, field: str, low: float, high: float, inclusive_low=True, inclusive_high=True):
    value = _get(config, field)
    ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = (
        ok_type
        and (value >= low if inclusive_low else value > low)
        and (value <= high if inclusive_high else value < high)
    )
    if not ok:
        lo, hi = ("[" if inclusive_low else "("), ("]" if inclusive_high else ")")
        raise ConfigError(f"config.{field}: must be in {lo}{low}, {high}{hi}, got {value!r}")


def require_known_fields(config, fields: dict):
    """fields: {top-level name: None (any value) or the set of its allowed sub-fields}."""
    for key in config.keys():
        if key not in fields:
            raise ConfigError(f"config.{key}: unknown field (known: {', '.join(sorted(fields))})")
        allowed = fields[key]
        if allowed is not None and isinstance(config[key], ml_collections.ConfigDict):
            for sub in config[key].keys():
                if sub not in allowed:
                    raise ConfigError(f"config.{key}.{sub}: unknown field (known: {', '.join(sorted(allowed))})")


def require_device_count(config, field: str):
    """A device count for the member mesh: 0 = all local devices, else at most that many."""
    require_nonneg_int(config, field)
    import jax

    available = jax.local_device_count()
    if _get(config, field) > available:
        raise ConfigError(
            f"config.{field}: {_get(config, field)} devices requested, "
            f"this process has {available} ({jax.default_backend()})"
        )


def optional(section, name: str, default=None):
    """``section.get(name, default)`` without its cost where ``name`` is missing: a ConfigDict's
    KeyError builds a did-you-mean message (difflib, ~50 us), and the dry run of a sweep of
    hundreds of members asks for optional fields (model.head_dim, model.dtype) tens of
    thousands of times."""
    return section[name] if name in section else default


def _get(config, field: str):
    node = config
    for part in field.split("."):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            raise ConfigError(f"config.{field}: missing field")
        node = node[part]
    return node
