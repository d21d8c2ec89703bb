"""The claims of the head-count experiment, decided on numbers.

"Beyond Parallelism: Synergistic Computational Graph Effects in Multi-Head Attention"
(Sáez de Ocáriz Borde, arXiv 2507.02944), Section 4 (training single- and multi-head
Transformers of equal size on copy and cycle), states five things that a run can check:

(a) copy is learnt by every head count;
(b) cycle is learnt more slowly with more heads;
(c) more heads -> lower mixing time, in every layer;
(d) more heads -> higher minimax fidelity, in every layer;
(e) the combined operator beats the best single head on most sequences for H >= 4.

Pure functions of analysis entries (dicts shaped like the members of ``analysis.json``:
``task``, ``heads``, ``seq_len``, ``accuracy``, ``layers``), one entry per trained model
(a seed of mhjax or a released checkpoint). The rules, precisely:

* **learnt**: held-out token accuracy >= its ceiling minus 1 point, for every seed. The
  ceiling is 100% for copy and (T-1)/T for cycle (position 0's target is the last token,
  invisible to a causal model), so 99% for copy and 98% for cycle at T = 100.
* **trend** over the head counts, per layer, on the means over seeds: it holds when (1) the
  mean moves the claimed way from the fewest to the most heads by more than the sum of those
  two groups' seed stds, and (2) no step between neighbouring head counts goes the other way
  by more than the sum of their seed stds. With one model per head count (the released
  checkpoints) the standard error of its mean over the evaluation sequences stands in for the
  seed std (0 when unknown: any reversal counts). A claim about layers holds when the trend
  holds in every layer.
* **not yet**: the models were trained for fewer than the paper's 20,000 steps and the
  task is not learnt by every head count, so (a) cannot fail yet, and (c)-(e), which are
  about trained models, are not judged (the detail still says where the trend stands).
* (b) compares the first evaluation step at which held-out accuracy reaches "learnt"
  (mean over seeds; a seed that never reaches it counts as later than any step) with the
  trend rule (later with more heads). It needs learning curves, so the released
  checkpoints (final weights only) are "not judged".
* (e): for every H >= 4, the share of sequences on which the combined operator's minimax
  fidelity beats the best single head's, averaged over layers and seeds, exceeds 50%.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import NamedTuple

import numpy as np

PAPER_STEPS = 20000  # the paper's training length (200 epochs of 100 batches)
MARGIN = 0.01  # "learnt": within 1 point of the task's accuracy ceiling

HOLDS, FAILS, NOT_YET, NOT_JUDGED = "holds", "does not hold", "not yet", "not judged"

CLAIMS = {
    "a": "copy is learnt by every head count",
    "b": "cycle is learnt more slowly with more heads",
    "c": "more heads -> lower mixing time, in every layer",
    "d": "more heads -> higher minimax fidelity, in every layer",
    "e": "the combined operator beats the best single head on most sequences (H >= 4)",
}


class Verdict(NamedTuple):
    claim: str  # "a" .. "e"
    task: str
    verdict: str  # HOLDS, FAILS, NOT_YET or NOT_JUDGED
    detail: str


def ceiling(task: str, seq_len: int) -> float:
    """The best token accuracy a causal model can reach on the task."""
    return (seq_len - 1) / seq_len if task == "cycle" else 1.0


def threshold(task: str, seq_len: int) -> float:
    return ceiling(task, seq_len) - MARGIN


def learnt_step(steps, accuracy, task: str, seq_len: int) -> int | None:
    """The first step of an accuracy curve at which the task counts as learnt (None: never)."""
    for step, value in zip(steps, accuracy):
        if value >= threshold(task, seq_len) - 1e-9:
            return int(step)
    return None


def group(entries) -> dict:
    """{task: {heads: [entries]}}, head counts ascending."""
    out: dict = defaultdict(lambda: defaultdict(list))
    for e in entries:
        out[e["task"]][int(e["heads"])].append(e)
    return {t: dict(sorted(h.items())) for t, h in sorted(out.items())}


def _stats(values) -> tuple[float, float]:
    v = np.asarray(values, float)
    if v.size == 0 or np.isnan(v).any():
        return math.nan, 0.0
    if np.isinf(v).any():  # a seed that never got there: the group as a whole has not
        return math.inf, 0.0
    return float(v.mean()), float(v.std())


def trend(means, stds, direction: int) -> tuple[bool, str]:
    """Does the mean move ``direction`` (+1 up, -1 down) with the head count? See the module doc."""
    m, s = np.asarray(means, float), np.asarray(stds, float)
    if m.size < 2 or np.isnan(m).any():
        return False, "fewer than two head counts"
    for i in range(m.size - 1):
        if np.isinf(m[i]) and np.isinf(m[i + 1]):
            continue  # neither group got there: no order between them
        if direction * (m[i + 1] - m[i]) < -(s[i] + s[i + 1]):
            return False, f"reversal between head counts {i + 1} and {i + 2}"
    if np.isinf(m[-1]) and np.isinf(m[0]):
        return False, "no change"
    if not direction * (m[-1] - m[0]) > s[0] + s[-1]:
        return False, "no significant change from the fewest to the most heads"
    return True, "monotonic"


def _fmt(mean: float, std: float, fmt: str) -> str:
    if math.isinf(mean):
        return "never"
    return fmt.format(mean) + (f"±{fmt.format(std)}" if std > 0 else "")


def _learnt(by_heads: dict) -> dict[int, bool]:
    return {
        h: all(e["accuracy"] >= threshold(e["task"], e["seq_len"]) - 1e-9 for e in es) for h, es in by_heads.items()
    }


def _accuracies(by_heads: dict) -> str:
    return ", ".join(
        f"H={h} {_fmt(*_stats([100 * e['accuracy'] for e in es]), '{:.2f}')}%" for h, es in by_heads.items()
    )


def _claim_a(by_task: dict, steps: int) -> list[Verdict]:
    by_heads = by_task.get("copy")
    if not by_heads:
        return [Verdict("a", "copy", NOT_JUDGED, "no copy models")]
    learnt = _learnt(by_heads)
    detail = "held-out accuracy " + _accuracies(by_heads)
    if all(learnt.values()):
        return [Verdict("a", "copy", HOLDS, detail)]
    missing = ", ".join(str(h) for h, ok in learnt.items() if not ok)
    return [Verdict("a", "copy", NOT_YET if steps < PAPER_STEPS else FAILS, f"{detail}; not learnt with H={missing}")]


def _claim_b(by_task: dict, steps: int, learnt_at: dict | None) -> list[Verdict]:
    by_heads = by_task.get("cycle")
    if not by_heads:
        return [Verdict("b", "cycle", NOT_JUDGED, "no cycle models")]
    if learnt_at is None:
        return [Verdict("b", "cycle", NOT_JUDGED, "needs learning curves; final weights only")]
    stats = {
        h: _stats([math.inf if learnt_at.get(e["name"]) is None else learnt_at[e["name"]] for e in es])
        for h, es in by_heads.items()
    }
    detail = "first step learnt: " + ", ".join(f"H={h} {_fmt(m, s, '{:.0f}')}" for h, (m, s) in stats.items())
    if all(math.isinf(m) for m, _ in stats.values()):
        return [Verdict("b", "cycle", NOT_YET if steps < PAPER_STEPS else FAILS, detail + "; no head count learns it")]
    ok, why = trend([m for m, _ in stats.values()], [s for _, s in stats.values()], +1)
    return [Verdict("b", "cycle", HOLDS if ok else FAILS, detail + ("" if ok else f"; {why}"))]


def _layer_trend(by_heads: dict, key: str, direction: int, fmt: str) -> tuple[bool, list[str]]:
    num_layers = min(len(e["layers"]) for es in by_heads.values() for e in es)
    ok_all, parts = True, []
    spread = key.replace("_mean", "_std")
    for layer in range(num_layers):
        stats = [_stats([e["layers"][layer][key] for e in es]) for es in by_heads.values()]
        for k, es in enumerate(by_heads.values()):
            if len(es) == 1 and spread in es[0]["layers"][layer] and es[0].get("num_sequences"):
                # one model: the standard error over the evaluation sequences is its only noise estimate
                stats[k] = (stats[k][0], es[0]["layers"][layer][spread] / math.sqrt(es[0]["num_sequences"]))
        ok, _ = trend([m for m, _ in stats], [s for _, s in stats], direction)
        ok_all &= ok
        arrow = " > " if direction < 0 else " < "  # the claimed order, head counts ascending
        parts.append(f"L{layer} " + arrow.join(_fmt(m, s, fmt) for m, s in stats) + (" ✓" if ok else " ✗"))
    return ok_all, parts


def _gate(by_heads: dict, steps: int) -> str | None:
    """Why a trained-model claim is not judged yet (None: judge it)."""
    learnt = _learnt(by_heads)
    if steps < PAPER_STEPS and not all(learnt.values()):
        return "not learnt with H=" + ", ".join(str(h) for h, ok in learnt.items() if not ok)
    return None


def _claims_cd(by_task: dict, steps: int) -> list[Verdict]:
    out = []
    for claim, key, direction, fmt in (
        ("c", "mixing_time_mean", -1, "{:.2f}"),
        ("d", "fidelity_pct_mean", +1, "{:.3g}"),
    ):
        for task, by_heads in by_task.items():
            ok, parts = _layer_trend(by_heads, key, direction, fmt)
            held = sum(p.endswith("✓") for p in parts)
            detail = f"H={','.join(map(str, by_heads))}: " + "; ".join(parts) + f" ({held}/{len(parts)} layers)"
            gate = _gate(by_heads, steps)
            verdict = NOT_YET if gate else (HOLDS if ok else FAILS)
            out.append(Verdict(claim, task, verdict, detail + (f"; {gate}" if gate else "")))
    return out


def _claim_e(by_task: dict, steps: int) -> list[Verdict]:
    out = []
    for task, by_heads in by_task.items():
        many = {h: es for h, es in by_heads.items() if h >= 4}
        if not many:
            out.append(Verdict("e", task, NOT_JUDGED, "no model with H >= 4"))
            continue
        shares = {
            h: _stats([100 * float(np.mean([layer["combined_beats_best_share"] for layer in e["layers"]])) for e in es])
            for h, es in many.items()
        }
        ok = all(m > 50 for m, _ in shares.values())
        detail = "share of sequences, mean over layers: " + ", ".join(
            f"H={h} {_fmt(m, s, '{:.0f}')}%" for h, (m, s) in shares.items()
        )
        gate = _gate(by_heads, steps)
        out.append(
            Verdict("e", task, NOT_YET if gate else (HOLDS if ok else FAILS), detail + (f"; {gate}" if gate else ""))
        )
    return out


def check_claims(entries, steps: int, learnt_at: dict | None = None) -> list[Verdict]:
    """Every claim's verdict for models trained ``steps`` steps.

    ``entries``: analysis entries (see the module doc); ``learnt_at``: {entry name: first step
    learnt or None} from the learning curves (None: no curves, claim (b) is not judged).
    """
    by_task = group(e for e in entries if e.get("status", "ok") == "ok")
    by_task = {t: h for t, h in by_task.items() if t in ("copy", "cycle")}
    return (
        _claim_a(by_task, steps)
        + _claim_b(by_task, steps, learnt_at)
        + _claims_cd(by_task, steps)
        + _claim_e(by_task, steps)
    )
