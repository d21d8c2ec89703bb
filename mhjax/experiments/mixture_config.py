"""What a mixture config may hold: validated before anything compiles, one line naming the
first bad field (config.<field>) and its allowed values. The data fields have one validator,
next to the sampler (data/mixture.py)."""

from __future__ import annotations

import math

from mhjax import config as cfg
from mhjax.data.mixture import DATA_FIELDS, MixtureConfigError, is_int, is_number, validate_mixture_config
from mhjax.experiments.base import STRATEGIES  # accepted for the CLI's sake: a mixture sweep is always one program
from mhjax.models import classifier

INIT_SCHEMES = ("random_decoders", "antisymmetric", "zero_plus_step", "random")
SWEEP_FIELDS = ("heads", "seed", "num_train", "step_size", "init_tau")
MAX_HEADS = 4096

# Every field a mixture config may have (a typo in a config file is an error, not ignored).
FIELDS = {
    "experiment": None,
    "seed": None,
    "strategy": None,
    "devices": None,
    "sweep": None,
    "data": {*DATA_FIELDS, "num_test"},
    "model": {"query"},
    "init": {"scheme", "first_step", "tau"},
    "train": {
        "steps",
        "chunk_steps",
        "eval_every",
        "checkpoint_every",
        "loss_points",
        "eval_points",
        "steps_per_example",
    },
    "analysis": {"lanczos_iters", "margin_iters", "margin_tol"},
}


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
    cfg.require_choice(config, "strategy", STRATEGIES)
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
    try:  # the data fields have one validator, next to the sampler
        validate_mixture_config(config.data)
    except MixtureConfigError as exc:
        raise cfg.ConfigError(f"config.data.{exc}") from None
    cfg.require_positive(config, "data.num_test", int)
    cfg.require_choice(config, "model.query", classifier.QUERIES)
    cfg.require_choice(config, "init.scheme", INIT_SCHEMES)
    first = cfg._get(config, "init.first_step")
    if first is not None and not (is_number(first) and first >= 0 and math.isfinite(first)):
        raise cfg.ConfigError(f"config.init.first_step: must be None or a number >= 0 (0 = no step); got {first!r}")
    cfg.require_range(config, "init.tau", 0.0, math.inf)  # 0: every random draw is zero (W = 0, U = 0)
    if "init_tau" in config.sweep:  # replaces init.tau: one value per member (a vmapped constant)
        taus = cfg.require_nonempty_tuple(config, "sweep.init_tau")
        _require_each(taus, "sweep.init_tau", lambda t: is_number(t) and 0 <= t < math.inf, "a finite number >= 0")
    for field in ("train.steps", "train.chunk_steps"):
        cfg.require_positive(config, field, int)
    if config.train.steps > 2**31 - 1:  # the per-member step counter is int32
        raise cfg.ConfigError(f"config.train.steps: must be at most {2**31 - 1}, got {config.train.steps}")
    for field in ("train.eval_every", "train.checkpoint_every"):
        cfg.require_nonneg_int(config, field)
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
    for field in ("analysis.lanczos_iters", "analysis.margin_iters"):
        cfg.require_positive(config, field, int)
    cfg.require_range(config, "analysis.margin_tol", 0.0, 1.0, inclusive_low=False, inclusive_high=False)
