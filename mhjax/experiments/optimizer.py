"""A sequence member's optimizer: Adam at the member's learning rate (the default, and the
papers'), or a language-model optimizer with a warmup-cosine schedule, decoupled weight decay
(AdamW) and gradient clipping, from config.train:

    schedule          "constant" (default) or "warmup_cosine": linear warmup from 0 over
                      warmup_steps, then cosine decay to min_learning_rate at decay_steps
    decay_steps       None (default: train.steps) or an int > warmup_steps: where the cosine
                      ends, flat at min_learning_rate after (nanoGPT's lr_decay_iters); set
                      apart from train.steps, a run can be trained longer
    warmup_steps      int >= 0 (default 0), < decay_steps
    min_learning_rate float >= 0 (default 0), the schedule's end value (below each learning rate)
    weight_decay      float >= 0 (default 0): AdamW's decoupled decay, learning rate times decay
                      times the weight, on matrices and embeddings (ndim >= 2), not on biases
                      and norm scales
    clip_norm         None (default) or a positive float: gradients clipped to this global
                      norm (per member) before Adam

Each member runs the schedule at its own learning rate (sweep.learning_rate stays an axis).
With every default the optimizer is the papers' ``inject_hyperparams(adam)``, state and numbers
unchanged. A schedule that ends at train.steps cannot be trained longer (``cannot_extend``);
one whose decay_steps is set can."""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mhjax import config as cfg

SCHEDULES = ("constant", "warmup_cosine")
DEFAULTS = {
    "train.schedule": "constant",
    "train.warmup_steps": 0,
    "train.decay_steps": None,
    "train.min_learning_rate": 0.0,
    "train.weight_decay": 0.0,
    "train.clip_norm": None,
}
FIELDS = tuple(f.removeprefix("train.") for f in DEFAULTS)


class Settings(NamedTuple):
    schedule: str = "constant"
    warmup_steps: int = 0
    min_learning_rate: float = 0.0
    weight_decay: float = 0.0
    clip_norm: float | None = None
    decay_steps: int | None = None  # where the cosine ends (None: train.steps)
    steps: int = 1  # train.steps

    @classmethod
    def from_config(cls, config) -> Settings:
        train = config.train
        values = {f: train.get(f, DEFAULTS[f"train.{f}"]) for f in FIELDS}
        return cls(**values, steps=int(train.steps))

    @property
    def horizon(self) -> int:
        """Where the cosine ends: decay_steps, else train.steps."""
        return self.steps if self.decay_steps is None else self.decay_steps

    @property
    def plain(self) -> bool:
        """Every default: the papers' Adam."""
        return self.schedule == "constant" and self.weight_decay == 0 and self.clip_norm is None

    def recorded(self) -> dict:
        """results.json's ``optimizer``: what every member ran with."""
        name = "adam" if self.weight_decay == 0 else "adamw"
        fields = [f for f in FIELDS if f != "decay_steps" or self.decay_steps is not None]  # older runs' records
        return {"name": name, **{f: getattr(self, f) for f in fields}}


def validate(config) -> None:
    """One line naming the first bad optimizer field of config.train."""
    s = Settings.from_config(config)
    if s.schedule not in SCHEDULES:
        raise cfg.ConfigError(f"config.train.schedule: must be one of {', '.join(SCHEDULES)}; got {s.schedule!r}")
    if s.decay_steps is not None and (
        isinstance(s.decay_steps, bool) or not isinstance(s.decay_steps, int) or s.decay_steps < 1
    ):
        raise cfg.ConfigError(f"config.train.decay_steps: must be None or an integer >= 1; got {s.decay_steps!r}")
    if isinstance(s.warmup_steps, bool) or not isinstance(s.warmup_steps, int) or not 0 <= s.warmup_steps < s.horizon:
        end = "train.steps" if s.decay_steps is None else "train.decay_steps"
        raise cfg.ConfigError(
            f"config.train.warmup_steps: must be an integer in [0, {end} = {s.horizon}); got {s.warmup_steps!r}"
        )
    for field in ("min_learning_rate", "weight_decay"):
        value = getattr(s, field)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
            raise cfg.ConfigError(f"config.train.{field}: must be a finite number >= 0; got {value!r}")
    if s.clip_norm is not None and (
        isinstance(s.clip_norm, bool)
        or not isinstance(s.clip_norm, (int, float))
        or not (math.isfinite(s.clip_norm) and s.clip_norm > 0)
    ):
        raise cfg.ConfigError(f"config.train.clip_norm: must be None or a positive number; got {s.clip_norm!r}")
    if s.schedule == "warmup_cosine":
        low = min(config.sweep.learning_rate)
        if s.min_learning_rate > low:
            raise cfg.ConfigError(
                f"config.train.min_learning_rate: must be at most the smallest sweep.learning_rate ({low:g}); "
                f"got {s.min_learning_rate!r}"
            )
    else:
        for field in ("warmup_steps", "min_learning_rate", "decay_steps"):
            if getattr(s, field):
                raise cfg.ConfigError(
                    f"config.train.{field}: applies to train.schedule 'warmup_cosine' only (the schedule is "
                    f"{s.schedule!r}); leave it out or set the schedule"
                )


def cannot_extend(settings: Settings) -> str | None:
    """Why a finished run of these settings cannot train longer (None: it can)."""
    if settings.schedule == "warmup_cosine" and settings.decay_steps is None:
        return (
            "train.schedule 'warmup_cosine' decays to min_learning_rate at train.steps, so more steps would change "
            "the schedule of the steps already taken; use a new workdir, with train.decay_steps set apart from "
            "train.steps to train longer later"
        )
    return None


def schedule(settings: Settings, learning_rate):
    """The member's learning rate as a function of the step count. ``learning_rate`` may be a
    traced per-member value: optax's warmup_cosine_decay_schedule is built at peak 1 (its end
    value min/lr) and scaled, since it branches on a concrete peak value."""
    if settings.schedule == "constant":
        return learning_rate
    unit = optax.warmup_cosine_decay_schedule(
        init_value=0.0,
        peak_value=1.0,
        warmup_steps=settings.warmup_steps,
        decay_steps=settings.horizon,
        end_value=settings.min_learning_rate / learning_rate,
    )
    return lambda count: learning_rate * unit(count)


def host_rates(settings: Settings, learning_rate: float, steps) -> np.ndarray:
    """``schedule``'s rates at ``steps`` in numpy (float64), for logging on the host without a
    compile: optax's warmup_cosine_decay_schedule written out (linear from 0 to the rate over
    warmup_steps, then a cosine to min_learning_rate at the horizon, flat after)."""
    steps = np.asarray(steps, np.float64)
    if settings.schedule == "constant":
        return np.full(steps.shape, float(learning_rate))
    warmup, decay = settings.warmup_steps, max(settings.horizon - settings.warmup_steps, 1)
    rising = learning_rate * np.minimum(steps, warmup) / max(warmup, 1)
    alpha = settings.min_learning_rate / learning_rate
    done = np.clip(steps - warmup, 0, decay) / decay
    falling = learning_rate * ((1 - alpha) * 0.5 * (1 + np.cos(np.pi * done)) + alpha)
    return np.where(steps < warmup, rising, falling)


def decay_mask(params):
    """Weight decay on matrices and embeddings (ndim >= 2), not on biases and norm scales."""
    return jax.tree_util.tree_map(lambda p: jnp.ndim(p) >= 2, params)


def _language_model(learning_rate, weight_decay, clip_norm=None):
    adamw = optax.adamw(learning_rate, weight_decay=weight_decay, mask=decay_mask)
    return adamw if clip_norm is None else optax.chain(optax.clip_by_global_norm(clip_norm), adamw)


def make(settings: Settings, learning_rate) -> optax.GradientTransformation:
    """The member's optimizer. The learning rate (at each step) lives in the state's
    ``hyperparams`` so that it can be vmapped and logged (train/learning_rate)."""
    if settings.plain:  # Adam as the reference (beta 0.9/0.999, eps 1e-8)
        return optax.inject_hyperparams(optax.adam)(learning_rate=learning_rate)
    if settings.clip_norm is None:
        return optax.inject_hyperparams(_language_model)(
            learning_rate=schedule(settings, learning_rate), weight_decay=settings.weight_decay
        )
    return optax.inject_hyperparams(_language_model)(
        learning_rate=schedule(settings, learning_rate),
        weight_decay=settings.weight_decay,
        clip_norm=settings.clip_norm,
    )
