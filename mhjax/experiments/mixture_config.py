"""What a mixture config may hold: validated before anything compiles, one line naming the
first bad field (config.<field>) and its allowed values. The data fields are validated by their
generator (the tokenized mixture's next to its sampler, data/mixture.py), the plug-ins (data,
phi, loss, step rule) are run on a few inputs.

``DEFAULTS`` gives every optional field its value when a config file leaves it out, and its type
on the command line: ``--config.train.loss=squared`` works whether or not the file defines
train.loss. ``setting(config, field)`` reads a field or its default."""

from __future__ import annotations

import math

from mhjax import config as cfg
from mhjax.data import mixture_data
from mhjax.data.mixture import MixtureConfigError, is_int, is_number
from mhjax.models import classifier, mixture_parts
from mhjax.plan import STRATEGIES  # accepted for the CLI's sake: a mixture sweep is always one program
from mhjax.train import snapshots

INIT_SCHEMES = ("random_decoders", "antisymmetric", "zero_plus_step", "random")
SWEEP_FIELDS = ("heads", "seed", "num_train", "step_size", "init_tau")
MAX_HEADS = 4096

# Optional fields: their value when absent, and their type for --config.FIELD=VALUE.
DEFAULTS = {
    "strategy": "auto",
    "devices": 0,
    "sweep.init_tau": (),  # absent: every member's tau is init.tau
    "data.generator": mixture_data.DEFAULT_GENERATOR,
    "data.*": None,  # a plug-in generator's own fields (the built-in one rejects any other)
    "model.query": "full",
    "model.phi": mixture_parts.DEFAULTS["phi"],
    "init.scheme": "random_decoders",
    "init.first_step": None,
    "init.nested_heads": False,
    "train.loss": mixture_parts.DEFAULTS["loss"],
    "train.step_rule": mixture_parts.DEFAULTS["step_rule"],
    "train.loss_points": 0,
    "train.eval_points": 0,
    "train.steps_per_example": 0.0,
    "train.divergence_factor": 1e3,
    "train.trace": True,
    "train.snapshot_steps": None,  # none (train/snapshots.py)
    "analysis.lanczos_iters": 16,
    "analysis.margin_iters": 20000,
    "analysis.margin_tol": 1e-4,
    "analysis.slope_window": (0.1, 1.0),  # loss_slope over k in [0.1 K, K]: the last decade
}


def solver_settings(config) -> dict:
    """The NTK margin solver's keywords (ntk.simplex_margin) from analysis.margin_iters and margin_tol."""
    return {
        "num_iters": int(setting(config, "analysis.margin_iters")),
        "tol": float(setting(config, "analysis.margin_tol")),
    }


# Every field a mixture config may have (a typo in a config file is an error, not ignored); the
# data fields besides these are the generator's (the tokenized mixture's, or a plug-in's own).
FIELDS = {
    "experiment": None,
    "seed": None,
    "strategy": None,
    "devices": None,
    "sweep": None,
    "data": None,
    "model": {"query", "phi"},
    "init": {"scheme", "first_step", "tau", "nested_heads"},
    "train": {
        "steps",
        "chunk_steps",
        "eval_every",
        "checkpoint_every",
        "loss_points",
        "eval_points",
        "steps_per_example",
        "loss",
        "step_rule",
        "divergence_factor",
        "preempt_grace_s",  # train/preempt.py
        "trace",
        "snapshot_steps",
    },
    "analysis": {"lanczos_iters", "margin_iters", "margin_tol", "slope_window"},
}
DATA_COMMON = ("dim", "seq_len", "num_test", "generator")


def setting(config, field: str):
    """config.<field>, or its DEFAULTS value when the config leaves it out."""
    node = config
    for part in field.split("."):
        if not hasattr(node, "get") or part not in node:
            return DEFAULTS[field]
        node = node[part]
    return node


def parts(config) -> dict:
    """{"phi", "loss", "step_rule": the chosen names}."""
    return {kind: setting(config, field.removeprefix("config.")) for kind, field in mixture_parts.FIELDS.items()}


def _require_each(values, field: str, ok, what: str):
    for value in values:
        if not ok(value):
            raise cfg.ConfigError(f"config.{field}: each must be {what}; got {value!r}")


def validate(config) -> None:
    """Raise ConfigError (one line naming ``config.<field>``) on the first bad field."""
    cfg.require_known_fields(config, FIELDS)
    cfg.require_nonneg_int(config, "seed")
    if config.seed >= 2**32:  # PRNGKey keeps only 32 bits: 2**32 would silently equal seed 0
        raise cfg.ConfigError(f"config.seed: must be an integer in [0, 2**32), got {config.seed}")
    if setting(config, "strategy") not in STRATEGIES:
        raise cfg.ConfigError(f"config.strategy: must be one of {', '.join(STRATEGIES)}; got {config.strategy!r}")
    if "devices" in config:
        cfg.require_device_count(config, "devices")
    if "sweep" not in config:
        raise cfg.ConfigError("config.sweep: missing field")
    for field in config.sweep.keys():
        if field not in SWEEP_FIELDS:
            raise cfg.ConfigError(f"config.sweep.{field}: unknown sweep field (allowed: {', '.join(SWEEP_FIELDS)})")
    heads = cfg.require_nonempty_tuple(config, "sweep.heads")
    _require_each(heads, "sweep.heads", lambda h: is_int(h) and 1 <= h <= MAX_HEADS, f"an integer in [1, {MAX_HEADS}]")
    seeds = cfg.require_nonempty_tuple(config, "sweep.seed")
    _require_each(seeds, "sweep.seed", lambda s: is_int(s) and 0 <= s < 2**32, "an integer in [0, 2**32)")
    sizes = cfg.require_nonempty_tuple(config, "sweep.num_train")
    _require_each(sizes, "sweep.num_train", lambda n: is_int(n) and n >= 1, "an integer >= 1")
    steps = cfg.require_nonempty_tuple(config, "sweep.step_size")
    _require_each(
        steps, "sweep.step_size", lambda e: is_number(e) and e > 0 and math.isfinite(e), "a positive finite number"
    )
    _validate_data(config)
    for field, allowed in (("model.query", classifier.QUERIES), ("init.scheme", INIT_SCHEMES)):
        if setting(config, field) not in allowed:
            raise cfg.ConfigError(
                f"config.{field}: must be one of {', '.join(allowed)}; got {setting(config, field)!r}"
            )
    first = setting(config, "init.first_step")
    if first is not None and not (is_number(first) and first >= 0 and math.isfinite(first)):
        raise cfg.ConfigError(f"config.init.first_step: must be None or a number >= 0 (0 = no step); got {first!r}")
    for field in ("init.nested_heads", "train.trace"):
        if not isinstance(setting(config, field), bool):
            raise cfg.ConfigError(f"config.{field}: must be True or False; got {setting(config, field)!r}")
    tau = cfg._get(config, "init.tau")  # 0: every random draw is zero (W = 0, U = 0)
    if not (is_number(tau) and 0 <= tau < math.inf):
        raise cfg.ConfigError(f"config.init.tau: must be a finite number >= 0; got {tau!r}")
    if "init_tau" in config.sweep:  # replaces init.tau: one value per member (a vmapped constant)
        taus = cfg.require_nonempty_tuple(config, "sweep.init_tau")
        _require_each(taus, "sweep.init_tau", lambda t: is_number(t) and 0 <= t < math.inf, "a finite number >= 0")
    for field in ("train.steps", "train.chunk_steps"):
        cfg.require_positive(config, field, int)
    if config.train.steps > 2**31 - 1:  # the per-member step counter is int32
        raise cfg.ConfigError(f"config.train.steps: must be at most {2**31 - 1}, got {config.train.steps}")
    for field in ("train.eval_every", "train.checkpoint_every"):
        cfg.require_nonneg_int(config, field)
    snapshots.steps_of(config)
    for field in ("loss_points", "eval_points"):  # optional: absent = 0
        if field in config.train:
            cfg.require_nonneg_int(config, f"train.{field}")
    per_example = config.train.get("steps_per_example")
    if per_example is not None:
        if not (is_number(per_example) and per_example >= 0 and math.isfinite(per_example)):
            raise cfg.ConfigError(
                f"config.train.steps_per_example: must be a number >= 0 (0 = off); got {per_example!r}"
            )
        need = max(1, round(per_example * max(sizes)))
        if per_example > 0 and need > config.train.steps:
            raise cfg.ConfigError(
                f"config.train.steps_per_example: {per_example} * max n = {need} steps exceeds "
                f"train.steps = {config.train.steps} (the program's length)"
            )
    factor = setting(config, "train.divergence_factor")
    if not (is_number(factor) and factor >= 0 and math.isfinite(factor)):
        raise cfg.ConfigError(f"config.train.divergence_factor: must be a finite number >= 0 (0 = off); got {factor!r}")
    mixture_parts.check_parts(parts(config), config.data.seq_len)
    for field in ("analysis.lanczos_iters", "analysis.margin_iters"):
        value = setting(config, field)
        if not (is_int(value) and value > 0):
            raise cfg.ConfigError(f"config.{field}: must be a positive integer, got {value!r}")
    tol = setting(config, "analysis.margin_tol")
    if not (is_number(tol) and 0 < tol < 1):
        raise cfg.ConfigError(f"config.analysis.margin_tol: must be in (0.0, 1.0), got {tol!r}")
    window = setting(config, "analysis.slope_window")
    if not (
        isinstance(window, (tuple, list))
        and len(window) == 2
        and all(is_number(v) and math.isfinite(v) for v in window)
        and 0 <= window[0] < window[1] <= 1
    ):
        raise cfg.ConfigError(
            f"config.analysis.slope_window: must be two fractions (a, b) of K with 0 <= a < b <= 1 (the slope's "
            f"steps [a K, b K]); got {window!r}"
        )


def _validate_data(config) -> None:
    """dim, seq_len, num_test; the generator registered and its own fields valid (a generator
    that lists its fields accepts no others), then its sample checked on a few keys."""
    if "data" not in config or not hasattr(config.data, "keys"):
        raise cfg.ConfigError("config.data: missing field")
    name = setting(config, "data.generator")
    generator = mixture_data.GENERATORS.get(name, "config.data.generator")
    known = generator.options.get("fields")
    if known is not None:
        for field in config.data.keys():
            if field not in (*known, *DATA_COMMON):
                allowed = ", ".join(sorted({*known, *DATA_COMMON}))
                raise cfg.ConfigError(f"config.data.{field}: unknown field for generator {name!r} (known: {allowed})")
    view = mixture_data.data_view(config.data)
    validate = generator.options.get("validate")
    if validate is not None:
        try:
            validate(view)
        except MixtureConfigError as exc:
            raise cfg.ConfigError(f"config.data.{exc}") from None
        except (ValueError, AttributeError) as exc:
            raise cfg.ConfigError(f"config.data: generator {name!r} rejects the data fields: {exc}") from None
    for field in ("dim", "seq_len", "num_test"):
        cfg.require_positive(config, f"data.{field}", int)
    mixture_data.check_generator(name, view)


def plugin_sources(config) -> dict:
    """{"data" | "phi" | "loss" | "step_rule": {name: source}} of the plug-ins ``config`` uses."""
    out = {"data": mixture_data.GENERATORS.sources([setting(config, "data.generator")])}
    for kind, name in parts(config).items():
        out[kind] = mixture_parts.KINDS[kind].sources([name])
    return out


def source_label(where: str) -> str:
    """The plug-in ``plugin_sources`` records at ``where`` ("mixture.<kind>.<name>" in mhjax.json)
    in its registry's words, e.g. "step rule 'decay'"."""
    kind, name = where.split(".")[-2:]
    registry = mixture_data.GENERATORS if kind == "data" else mixture_parts.KINDS[kind]
    return f"{registry.noun} {name!r}"


def restore_plugins(recorded: dict | None, where: str) -> None:
    """Register again the plug-ins a workdir's run used (W/mhjax.json's "mixture")."""
    recorded = recorded or {}
    mixture_data.GENERATORS.restore(recorded.get("data"), where)
    for kind, registry in mixture_parts.KINDS.items():
        registry.restore(recorded.get(kind), where)
