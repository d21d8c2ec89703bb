"""What the sequence experiment adds to results.json at the end of training: held-out loss and
accuracy per position (``eval_loss_by_position``, ``eval_accuracy_by_position``), evaluated on
the same held-out sequences as the loop's scalar evaluation, with the plain eval-mode model at
each member's own head count; a text member's bits (``eval_bits_per_byte`` for a byte file,
``eval_bits_per_token`` for a .bin: the mean of its per-position held-out loss over ln 2, the
loop's eval_loss up to float32 rounding) and its perplexity (``eval_perplexity``, 2 ** bits) beside
its ``heldout_unigram_entropy_bits``; and a
member's model rebuilt from its results entry.

Besides, per member: ``eval_loss_se`` (and ``eval_bits_per_byte_se`` / ``_per_token_se``), the
standard error of its held-out loss over the windows (analysis/paired.py); ``eval_set``, which
held-out set it was scored on (its evaluation key: members with equal ``eval_set`` were scored
on the same windows, which every member of a text sweep is); and ``eval_window_sums``, the (2, N)
per-window loss sums and weights, which the workdir keeps as ``W/eval_windows/<member>.npy`` for
the paired comparison of head counts (io/window_files.py)."""

from __future__ import annotations

import math

import numpy as np

from mhjax.analysis.forward import apply_fn
from mhjax.analysis.paired import mean_se, window_sums
from mhjax.analysis.positions import by_position as metrics_by_position
from mhjax.analysis.positions import member_token_losses
from mhjax.data.tasks import Batch
from mhjax.experiments.architecture import record_sizes
from mhjax.models.probe import model_sizes
from mhjax.train.engine import unstack
from mhjax.train.members import derive_key
from mhjax.train.placement import to_host


def eval_key(root: int, seed: int, task: str, bound) -> np.ndarray:
    """The key of a member's held-out set. A task with a held-out split (text: windows of the
    corpus's last part) draws it from (root seed, task) alone: every member of the sweep, whatever
    its seed, is scored on the same windows, so head counts pair across seeds too. A task of
    generated sequences (copy, cycle, ...) draws a fresh set per seed, as it always has (recorded
    numbers stay): members of one seed share it, so head counts pair within a seed."""
    return derive_key(root, "eval", task) if bound.heldout is not None else derive_key(root, seed, "eval", task)


def held_out(experiment, member) -> Batch:
    """The held-out sequences the loop's evaluation averages over (numpy): all data.num_eval of them."""
    m, d, consts = experiment.config.model, experiment.config.data, experiment.member_constants(member)
    batch = experiment.tasks[int(consts.task_id)].draw_eval(consts.eval_key, d.num_eval, m.seq_len, m.vocab_size)
    return Batch(*(np.asarray(a) for a in batch))


def eval_set(experiment, member) -> str:
    """The id of the held-out set ``member`` is scored on: its evaluation key and size."""
    key = np.asarray(experiment.member_constants(member).eval_key, np.uint32).ravel()
    return "".join(f"{int(k):08x}" for k in key) + f"-{experiment.config.data.num_eval}"


def position_metrics(experiment, member, params) -> dict:
    """{"eval_loss_by_position", "eval_accuracy_by_position"}: (T,) lists, null where the task
    weights no sequence (analysis/positions.py); the standard error of the held-out loss, the
    held-out set's id and its per-window sums (module docstring)."""
    sizes = model_sizes(params)  # the member's own sizes (architecture axes)
    tokens, targets, weights = held_out(experiment, member)
    loss, correct = member_token_losses(params, member["heads"], tokens, targets, sizes)
    out = {f"eval_{k}": v for k, v in metrics_by_position(loss, correct, weights).items()}
    sums = window_sums(loss, weights)
    out.update(eval_loss_se=mean_se(sums)[1], eval_set=eval_set(experiment, member), eval_window_sums=sums)
    facts = experiment.tasks[int(experiment.member_constants(member).task_id)].facts
    if "heldout_unigram_entropy_bits" in facts:  # text: every position weighted, so the plain mean
        bits = float(np.mean(out["eval_loss_by_position"])) / math.log(2)
        per = "byte" if facts.get("text_format") == "bytes" else "token"
        out.update({f"eval_bits_per_{per}": bits, f"eval_bits_per_{per}_se": out["eval_loss_se"] / math.log(2)})
        out["eval_perplexity"] = 2.0**bits if bits < 1000 else math.inf  # per byte (token): beside the bits
        out.update(facts)
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
