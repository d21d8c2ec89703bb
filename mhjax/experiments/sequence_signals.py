"""What a sequence run logs beside its losses, for a language modeller: the held-out loss in bits
at every evaluation (text), the learning rate of every step from the schedule on the host, and
the throughput as tokens per second and MFU (models/flops.py)."""

from __future__ import annotations

import math

import jax
import numpy as np

from mhjax.experiments import architecture, optimizer
from mhjax.models import flops


def bits_fields(experiment, index: int, metrics: dict) -> dict:
    """``metrics`` of member ``index``'s evaluation with its held-out loss in bits (text only:
    ``eval_bits_per_byte``, per token for a .bin) and as a perplexity (``eval_perplexity``, per
    byte or token alike: 2 ** bits, exp of the loss)."""
    member = experiment.members[index]
    facts = experiment.tasks[int(experiment.member_constants(member).task_id)].facts
    if "text_format" not in facts or "eval_loss" not in metrics:
        return metrics
    per = "byte" if facts["text_format"] == "bytes" else "token"
    loss = metrics["eval_loss"]
    return {**metrics, f"eval_bits_per_{per}": loss / math.log(2), "eval_perplexity": _perplexity(loss)}


def _perplexity(loss: float) -> float:
    """exp(loss): the held-out perplexity; inf past float range (a loss above ~709 nats), never an error."""
    return math.exp(loss) if loss < 709 else math.inf


def learning_rates(experiment, indices, first_step: int, length: int) -> np.ndarray:
    """(length, members): the learning rate each of the members ``indices`` takes the steps
    first_step .. first_step + length - 1 with (the update from theta_k uses the schedule at k, as
    optax.inject_hyperparams does), computed on the host from the schedule."""
    steps = np.arange(first_step, first_step + length)
    settings = optimizer.Settings.from_config(experiment.config)
    rates = [float(experiment.members[i]["learning_rate"]) for i in indices]
    return np.stack([optimizer.host_rates(settings, rate, steps) for rate in rates], axis=1)


def flops_per_member_step(experiment) -> float:
    """The members' mean analytic training FLOPs of one step (models/flops.py)."""
    m, d = experiment.config.model, experiment.config.data
    total = 0.0
    for member in experiment.members:
        model = architecture.member_model(experiment.config, member)
        sizes = (d.batch_size, m.seq_len, model.width, model.num_layers, model.mlp_dim, m.vocab_size)
        total += flops.train_step_flops(*sizes, model.attention_width)
    return total / max(len(experiment.members), 1)


def throughput(experiment, member_steps_per_s: float, devices: int) -> dict:
    """{"tokens_per_s": member-steps/s x batch x T, "mfu": analytic FLOPs/s over the devices' peak
    (None where models/cost.py has none, e.g. a CPU)}."""
    c = experiment.config
    tokens = member_steps_per_s * c.data.batch_size * c.model.seq_len
    kind = jax.devices()[0].device_kind
    dtype = c.model.get("dtype", "float32")
    return {
        "tokens_per_s": tokens,
        "mfu": flops.mfu(member_steps_per_s * flops_per_member_step(experiment), kind, devices, dtype),
    }
