"""A member's status from its whole loss path: what results.json, the console and TensorBoard say
of a run that went non-finite or blew up.

Two events mark a member "diverged" (engine.MemberState keeps both in-graph):
* non-finite: a training loss or a parameter became NaN or infinite; the member is frozen from
  that step on (its state no longer changes), the others continue;
* exceeded: a training loss rose above ``divergence_factor`` x the member's step-0 loss (the
  experiment's ``train.divergence_factor``; 0 = off); the member is flagged, not frozen, so a
  loss that blew up to 5e6 and then underflowed to 0.0 is still called what it was.

``diverged_at_step`` is the first of the two (null in every record of a member that did not
diverge); ``diverged_reason`` says which and with what numbers. A run whose members all stayed
below the factor and finite is "ok".
"""

from __future__ import annotations

import math

DIVERGED, OK = "diverged", "ok"


class DivergedError(Exception):
    """A run with ``fail_on_divergence`` ended with a diverged member (everything was written);
    ``members``: their names. ``mhjax train --fail-on-divergence`` exits with ``EXIT_STATUS``."""

    EXIT_STATUS = 3

    def __init__(self, message: str, members: list[str]):
        super().__init__(message)
        self.members = members


def _number(value) -> float | None:
    value = float(value)
    return value if math.isfinite(value) else None


def path_fields(status: dict, j: int, factor: float) -> dict:
    """results.json fields of member ``j`` of a program from its host status
    (engine.member_status): the loss path's summary and, when it diverged, when and why."""
    nonfinite_at = int(status["diverged_at"][j]) if bool(status["diverged"][j]) else None
    exceeded_at = int(status["exceeded_at"][j])
    exceeded_at = exceeded_at if exceeded_at >= 0 else None
    initial, peak = _number(status["initial_loss"][j]), _number(status["max_loss"][j])
    fields = {
        "initial_train_loss": initial,
        "max_train_loss": peak,
        "loss_exceeded_at_step": exceeded_at,
        "nonfinite_at_step": nonfinite_at,
        "status": OK,
        "diverged_at_step": None,  # a field of every record, as README lists it
    }
    reasons, steps = [], []
    if exceeded_at is not None:
        steps.append(exceeded_at)
        reasons.append(
            f"training loss above train.divergence_factor {factor:g} x its step-0 loss {initial:.4g} at step "
            f"{exceeded_at} (maximum {peak:.4g})"
        )
    if nonfinite_at is not None:
        steps.append(nonfinite_at)
        reasons.append(f"non-finite loss or parameters at step {nonfinite_at} (frozen from then on)")
    if reasons:
        fields.update(status=DIVERGED, diverged_at_step=min(steps), diverged_reason="; ".join(reasons))
    return fields


def merge(record: dict, extra: dict) -> dict:
    """``extra`` (an experiment's extra_results) merged into ``record``: an experiment may mark a
    member diverged for a reason of its own (its final loss, with its own ``diverged_at_step``),
    never clear the path's verdict nor move its step."""
    if record.get("status") == DIVERGED:
        extra = dict(extra)
        if extra.get("status") == DIVERGED and extra.get("diverged_reason"):
            extra["diverged_reason"] = f"{record['diverged_reason']}; {extra['diverged_reason']}"
        else:
            extra.pop("diverged_reason", None)
        extra["status"] = DIVERGED
        extra.pop("diverged_at_step", None)
    record.update(extra)
    return record


def chunk_messages(names: list[str], idx: list[int], status: dict, reported: set, factor: float) -> list[tuple]:
    """(member name, line) for members that newly went non-finite or above the factor in a chunk
    (``reported`` holds the (member index, event) pairs already said)."""
    lines = []
    for j, i in enumerate(idx):
        if bool(status["diverged"][j]) and (i, "nonfinite") not in reported:
            reported.add((i, "nonfinite"))
            at = int(status["diverged_at"][j])
            lines.append((names[i], f"member {names[i]} diverged at step {at} (non-finite loss or parameters); frozen"))
        at = int(status["exceeded_at"][j])
        if at >= 0 and (i, "exceeded") not in reported:
            reported.add((i, "exceeded"))
            lines.append(
                (
                    names[i],
                    f"member {names[i]} diverged at step {at}: training loss above train.divergence_factor {factor:g}"
                    f" x its step-0 loss {float(status['initial_loss'][j]):.4g}; flagged, training continues",
                )
            )
    return lines


def diverged_lines(records: list[dict]) -> list[str]:
    """The closing lines naming every diverged member and why (empty when none diverged)."""
    bad = [r for r in records if r.get("status") == DIVERGED]
    if not bad:
        return []
    lines = [f"{len(bad)} of {len(records)} members diverged (left out of the summary means and verdicts):"]
    lines += [f"  {r['name']}: {r.get('diverged_reason') or 'diverged'}" for r in bad]
    return lines


def check_fail(records: list[dict], wanted: bool, flag: str) -> None:
    """Raise DivergedError when ``wanted`` and a member diverged; ``flag``: the interface that asked
    for it (``--fail-on-divergence`` or ``fail_on_divergence=True``)."""
    bad = [r["name"] for r in records if r.get("status") == DIVERGED]
    if wanted and bad:
        raise DivergedError(f"{flag}: {len(bad)} member(s) diverged ({', '.join(bad)}); results are written", bad)
