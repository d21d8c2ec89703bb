"""What a sequence config may hold: validated before anything compiles, one line naming the
first bad field (config.<field>) and its allowed values."""

from __future__ import annotations

import math

from mhjax import config as cfg
from mhjax.analysis import comparisons
from mhjax.data import sequences
from mhjax.experiments import architecture, optimizer, sweep_skip, task_params
from mhjax.models import precision
from mhjax.models.attention_choice import AUTO, IMPLEMENTATIONS
from mhjax.plan import STRATEGIES
from mhjax.train import halving, snapshots

# Optional fields: what a config without them runs with (a sweep field left out: every member
# takes config.model's value; experiments/architecture.py).
DEFAULTS = {
    "attention": AUTO,
    "devices": 0,  # every device (train/placement.py); --config.devices=N on a config that leaves it out
    "model.scan_layers": "auto",
    "model.head_dim": None,
    "model.dtype": precision.DEFAULT,  # float32 (models/precision.py)
    "train.divergence_factor": 10.0,
    "train.snapshot_steps": None,  # none (train/snapshots.py)
    "train.halving": None,  # no successive halving (train/halving.py)
    **{f"sweep.{field}": () for field in architecture.FIELDS},
    **optimizer.DEFAULTS,  # constant-rate Adam, no weight decay, no clipping
    "data.path": "",  # the text task's corpus file (data/text.py)
    "data.holdout": 0.1,  # the fraction of it held out, at its end
    "compare.tune": (),  # head counts at each swept value (analysis/comparisons.py)
}
SCAN_LAYERS = ("auto", "on", "off")


def requested_attention(config) -> str:
    """config.attention, or its default."""
    return config.get("attention", DEFAULTS["attention"])


def scan_layers(config, backend: str) -> bool:
    """config.model.scan_layers: the layers as one scanned block (models/transformer.py). "auto" scans
    on a TPU only. On a GPU the scanned step copies each layer's saved activations into and out of
    stacks (benchmarks/RESULTS.md, the paper sweep compiled for an H200: 0.50 GB per member-step
    against 0.32 unrolled under the Pallas kernels, 3.19 against 1.48 on the JAX path), while under
    the kernels it saves ~2 s of a ~20 s compile: it pays only for runs of a few ten thousand
    member-steps. "off" keeps the unrolled blocks everywhere, "on" scans everywhere."""
    value = config.model.get("scan_layers", DEFAULTS["model.scan_layers"])
    if value != "auto":
        return value == "on"
    return backend == "tpu"


def divergence_factor(config) -> float:
    """config.train.divergence_factor, or its default: a member whose training loss (one minibatch,
    with dropout) ever exceeds this times its step-0 loss is "diverged" (train/status.py). Chosen
    above the largest max/step-0 ratio of the bundled configs (README, "Status")."""
    return float(config.train.get("divergence_factor", DEFAULTS["train.divergence_factor"]))


def validate(config) -> None:
    """Raise ConfigError naming the first bad field."""
    for field in ("model.width", "model.num_layers", "model.mlp_dim", "model.vocab_size", "model.seq_len"):
        cfg.require_positive(config, field, int)
    cfg.require_range(config, "model.dropout", 0.0, 1.0, inclusive_high=False)
    cfg.require_choice(config, "data.protocol", sequences.PROTOCOLS)
    for field in ("data.batch_size", "data.num_eval", "data.num_train", "train.steps", "train.chunk_steps"):
        cfg.require_positive(config, field, int)
    for field in ("train.eval_every", "train.checkpoint_every"):
        cfg.require_nonneg_int(config, field)
    factor = config.train.get("divergence_factor", DEFAULTS["train.divergence_factor"])
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not (math.isfinite(factor) and factor >= 0):
        raise cfg.ConfigError(f"config.train.divergence_factor: must be a finite number >= 0 (0 = off); got {factor!r}")
    if config.train.steps > 2**31 - 1:  # the per-member step counter is int32
        raise cfg.ConfigError(f"config.train.steps: must be at most {2**31 - 1}, got {config.train.steps}")
    snapshots.steps_of(config)
    cfg.require_choice(config, "strategy", STRATEGIES)
    if "attention" in config:  # optional: configs without it run DEFAULTS["attention"]
        cfg.require_choice(config, "attention", IMPLEMENTATIONS)
    if "scan_layers" in config.model:
        cfg.require_choice(config, "model.scan_layers", SCAN_LAYERS)
    if "dtype" in config.model:
        cfg.require_choice(config, "model.dtype", precision.DTYPES)
    cfg.require_nonneg_int(config, "seed")
    if config.seed >= 2**32:  # PRNGKey keeps only 32 bits here: 2**32 would silently equal seed 0
        raise cfg.ConfigError(f"config.seed: must be an integer in [0, 2**32), got {config.seed}")
    if config.data.protocol == "fixed" and config.data.num_train < config.data.batch_size:
        raise cfg.ConfigError(
            f"config.data.num_train: must be >= data.batch_size ({config.data.batch_size}) under the fixed protocol, "
            f"got {config.data.num_train}"
        )
    cfg.require_nonempty_tuple(config, "sweep.task")
    task_params.bound_tasks(config)  # registered, its parameters declared, and each sampler checked
    architecture.validate(config)  # swept sizes, model.head_dim, heads dividing each width they meet
    for seed in cfg.require_nonempty_tuple(config, "sweep.seed"):
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**32:  # folded into keys as uint32
            raise cfg.ConfigError(f"config.sweep.seed: each must be an integer in [0, 2**32); got {seed!r}")
    for lr in cfg.require_nonempty_tuple(config, "sweep.learning_rate"):
        if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not lr > 0 or not math.isfinite(lr):
            raise cfg.ConfigError(f"config.sweep.learning_rate: each must be a positive number; got {lr!r}")
    optimizer.validate(config)
    comparisons.check_tune(config)
    halving.spec_of(config)  # rungs, keep, and compare.tune set
    known = {"task", "heads", "seed", "learning_rate", *architecture.FIELDS}
    for field in config.sweep.keys():
        if field not in known:
            raise cfg.ConfigError(f"config.sweep.{field}: unknown sweep field (allowed: {', '.join(sorted(known))})")
    cfg.require_known_fields(config, FIELDS)
    sweep_skip.entries(config)  # each entry names swept fields and swept values
    if "devices" in config:
        cfg.require_device_count(config, "devices")


# Every field a sequence config may have (a typo in a config file is an error, not ignored).
FIELDS = {
    "experiment": None,
    "seed": None,
    "strategy": None,
    "attention": None,
    "devices": None,
    "sweep": None,
    "sweep_skip": None,  # grid points left out (experiments/sweep_skip.py)
    "task_params": None,  # {task: {parameter: value or tuple}} (experiments/task_params.py)
    "compare": {"tune"},  # head counts each at its best setting (analysis/comparisons.py)
    "model": {"width", "num_layers", "mlp_dim", "vocab_size", "seq_len", "dropout", "scan_layers", "head_dim", "dtype"},
    "data": {"protocol", "num_train", "batch_size", "num_eval", "path", "holdout"},
    "train": {"steps", "chunk_steps", "eval_every", "checkpoint_every", "snapshot_steps", "divergence_factor"}
    | {"preempt_grace_s", "halving"}  # train/preempt.py, train/halving.py
    | set(optimizer.FIELDS),
}
