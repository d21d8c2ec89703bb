"""What the sequence experiment adds to results.json at the end of training: held-out loss and
accuracy per position (``eval_loss_by_position``, ``eval_accuracy_by_position``), evaluated on
the same held-out sequences as the loop's scalar evaluation, with the plain eval-mode model at
each member's own head count; a text member's bits (``eval_bits_per_byte`` for a byte file,
``eval_bits_per_token`` for a .bin: the mean of its per-position held-out loss over ln 2, the
loop's eval_loss up to float32 rounding) and its perplexity (``eval_perplexity``, 2 ** bits) beside
its ``heldout_unigram_entropy_bits``; and a
member's model rebuilt from its results entry.

The held-out set of all these is the test set (experiments/heldout_sets.py). Besides, per member:
``eval_loss_se`` (and ``eval_bits_per_byte_se`` / ``_per_token_se``), the standard error of its
held-out loss over the windows (analysis/paired.py; text: clustered by source file or block);
``eval_set``, which held-out set it was scored on (its evaluation key: members with equal
``eval_set`` were scored on the same windows, which every member of a text sweep is); and
``eval_window_sums``, the (2, N) per-window loss sums and weights, which the workdir keeps as
``W/eval_windows/<member>.npy`` for the paired comparison of head counts (io/window_files.py).
The validation set alike: ``val_loss``, ``val_loss_se``, ``val_set``, text ``val_bits_per_byte``
(or ``_per_token``) and ``val_window_sums`` (``W/eval_windows/<member>.validation.npy``)."""

from __future__ import annotations

import math

import numpy as np

from mhjax.analysis.forward import apply_fn
from mhjax.analysis.paired import mean_se, window_sums
from mhjax.analysis.positions import by_position as metrics_by_position
from mhjax.analysis.positions import member_token_losses
from mhjax.data.tasks import Batch
from mhjax.experiments import heldout_sets
from mhjax.experiments.architecture import record_sizes
from mhjax.models.probe import model_sizes
from mhjax.train.engine import unstack
from mhjax.train.placement import to_host


def eval_key(root: int, seed: int, task: str, bound) -> np.ndarray:
    """The key of a member's held-out (test) set (experiments/heldout_sets.key). A task of
    generated sequences draws a fresh set per seed, as it always has (recorded numbers stay)."""
    return heldout_sets.key(root, seed, task, bound, "test")


def _val_key(experiment, member) -> np.ndarray:
    index = int(experiment.member_constants(member).task_id)
    return heldout_sets.key(
        experiment.config.seed, member["seed"], member["task"], experiment.tasks[index], "validation"
    )


def held_out(experiment, member, which: str = "test") -> Batch:
    """The held-out sequences of ``which`` set (numpy): all data.num_eval of them; the test set's
    are the ones the loop's evaluation averages over."""
    m, d, consts = experiment.config.model, experiment.config.data, experiment.member_constants(member)
    task = experiment.tasks[int(consts.task_id)]
    if which == "test":
        batch = task.draw_eval(consts.eval_key, d.num_eval, m.seq_len, m.vocab_size)
    else:
        batch = task.draw_validation(_val_key(experiment, member), d.num_eval, m.seq_len, m.vocab_size)
    return Batch(*(np.asarray(a) for a in batch))


def eval_set(experiment, member, which: str = "test") -> str:
    """The id of the held-out set ``member`` is scored on: its key and size."""
    key = experiment.member_constants(member).eval_key if which == "test" else _val_key(experiment, member)
    return heldout_sets.set_id(key, experiment.config.data.num_eval)


def position_metrics(experiment, member, params) -> dict:
    """{"eval_loss_by_position", "eval_accuracy_by_position"}: (T,) lists, null where the task
    weights no sequence (analysis/positions.py); the standard error of the held-out loss, the
    held-out set's id and its per-window sums (module docstring)."""
    sizes = model_sizes(params)  # the member's own sizes (architecture axes)
    tokens, targets, weights = held_out(experiment, member)
    loss, correct = member_token_losses(params, member["heads"], tokens, targets, sizes)
    out = {f"eval_{k}": v for k, v in metrics_by_position(loss, correct, weights).items()}
    task = experiment.tasks[int(experiment.member_constants(member).task_id)]
    sums = window_sums(loss, weights)
    clusters = heldout_sets.clusters(experiment.config, task, "test")
    out.update(eval_loss_se=mean_se(sums, clusters)[1], eval_set=eval_set(experiment, member), eval_window_sums=sums)
    val_tokens, val_targets, val_weights = held_out(experiment, member, "validation")
    val_sums = window_sums(member_token_losses(params, member["heads"], val_tokens, val_targets, sizes)[0], val_weights)
    val_loss, val_se = mean_se(val_sums, heldout_sets.clusters(experiment.config, task, "validation"))
    val_set = eval_set(experiment, member, "validation")
    out.update(val_loss=val_loss, val_loss_se=val_se, val_set=val_set, val_window_sums=val_sums)
    if "heldout_unigram_entropy_bits" in task.facts:  # text: every position weighted, so the plain mean
        bits = float(np.mean(out["eval_loss_by_position"])) / math.log(2)
        per = "byte" if task.facts.get("text_format") == "bytes" else "token"
        out.update({f"eval_bits_per_{per}": bits, f"eval_bits_per_{per}_se": out["eval_loss_se"] / math.log(2)})
        out["eval_perplexity"] = 2.0**bits if bits < 1000 else math.inf  # per byte (token): beside the bits
        out.update({f"val_bits_per_{per}": val_loss / math.log(2), f"val_bits_per_{per}_se": val_se / math.log(2)})
        out.update(task.facts)
    return out


def by_position(experiment, trained) -> dict[int, dict]:
    """{member index: its per-position results} from the trained programs (Experiment.extra_results)."""
    host = {t.program.name: to_host(t.states.params) for t in trained}  # gathered if distributed
    params = unstack([t.program for t in trained], host)
    return {i: position_metrics(experiment, member, params[i]) for i, member in enumerate(experiment.members)}


def record_model(record: dict, config: dict):
    """Eval-mode ``apply(params, tokens) -> logits`` at the member's heads, from its results entry
    and the run's config (Experiment.record_model): no task code runs."""
    return apply_fn(record_sizes(config["model"], record), int(record["heads"]))
