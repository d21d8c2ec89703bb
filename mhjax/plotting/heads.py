"""`mhjax report`'s tables of head ablation and attention rollout per head count: synergy for
the task (accuracy) beside synergy on the DAG, rollout's minimum at the sink, and whether the
heads the DAG view weights most are the ones whose removal hurts most."""

from __future__ import annotations

from mhjax.analysis.ablation import synergy_verdict
from mhjax.plotting.report import _analysis_by_task_heads, mean_sd

MARKS = {True: " ✓", False: " ✗", None: ""}


def _layer(entry: dict, layer: int) -> dict:
    layers = entry.get("layers") or []
    return layers[layer] if layer < len(layers) else {}


def _values(entries: list[dict], key: str, layer: int | None = None) -> list:
    return [(e if layer is None else _layer(e, layer)).get(key) for e in entries]


def _table(title: str, columns: list[str], rows: list[list[str]]) -> list[str]:
    return [
        title,
        "",
        "| " + " | ".join(["heads"] + columns) + " |",
        "|---:|" + "---:|" * len(columns),
        *("| " + " | ".join(row) + " |" for row in rows),
        "",
    ]


def head_tables(analysis: dict) -> str:
    """Markdown tables per task (empty when the analysis predates head ablation and rollout)."""
    by_task = _analysis_by_task_heads(analysis)
    entries = [e for by_heads in by_task.values() for group in by_heads.values() for e in group]
    if not any("rollout_min" in e for e in entries):
        return ""
    lines = [
        "### Which heads matter: head ablation and attention rollout",
        "",
        "On the same evaluation sequences; mean ± std over seeds. *Accuracy synergy*: the full model's token "
        "accuracy minus the best accuracy with a single head kept in that layer (the others' outputs zeroed before "
        "the output projection), in points; ✓ with two or more seeds when the full layer beats every single head "
        "by more than the std over seeds, ✗ when not; no mark with one seed. *DAG synergy*: % of sequences on which "
        "the combined operator's minimax fidelity beats the best single head's. *Rollout min*: attention rollout "
        "(0.5 A + 0.5 I per layer, heads by the learned weights β unless said) through the last layer, the "
        "worst-served position's share at the sink, %; ρ: Spearman correlation across sequences with the layer's "
        "minimax fidelity. *β vs removal*: Spearman correlation across a layer's heads between β and the loss "
        "increase when that head is removed.",
        "",
    ]
    for task, by_heads in by_task.items():
        num_layers = max(len(e.get("layers") or []) for group in by_heads.values() for e in group)
        layers = range(num_layers)
        synergy, rolled, weighted = [], [], []
        for heads, group in by_heads.items():
            row = [str(heads)]
            for l in layers:
                diffs = _values(group, "accuracy_synergy", l)
                mark = MARKS[synergy_verdict(diffs)] if any(d is not None for d in diffs) else ""
                row += [
                    mean_sd(diffs, "{:.2f}", 100.0) + mark,
                    mean_sd(_values(group, "combined_beats_best_share", l), "{:.0f}", 100.0),
                ]
            synergy.append(row)
            row = [str(heads), mean_sd(_values(group, "rollout_min"), "{:.3f}", 100.0)]
            row.append(mean_sd(_values(group, "rollout_min_mean_heads"), "{:.3f}", 100.0))
            for l in layers:
                row += [
                    mean_sd(_values(group, "rollout_min", l), "{:.3f}", 100.0),
                    mean_sd(_values(group, "rollout_fidelity_spearman", l), "{:.2f}"),
                ]
            rolled.append(row)
            weighted.append(
                [str(heads)] + [mean_sd(_values(group, "head_weight_ablation_spearman", l), "{:.2f}") for l in layers]
            )
        lines += _table(
            f"**{task}: synergy for the task (accuracy, points) beside synergy on the DAG (% of sequences)**",
            [c for l in layers for c in (f"layer {l} accuracy", f"layer {l} DAG")],
            synergy,
        )
        lines += _table(
            f"**{task}: attention rollout, min share at the sink %**",
            ["last layer, β", "last layer, mean of heads"]
            + [c for l in layers for c in (f"through layer {l}", f"layer {l} ρ")],
            rolled,
        )
        if any(cell != "-" for row in weighted for cell in row[1:]):  # one head per layer: undefined
            lines += _table(
                f"**{task}: β vs removal (Spearman across heads)**", [f"layer {l}" for l in layers], weighted
            )
    return "\n".join(lines)


def _fmt(value, fmt: str, scale: float = 1.0) -> str:
    return "-" if value is None else fmt.format(scale * value)


def member_lines(entry: dict) -> list[str]:
    """analysis.md lines of one model: loss, rollout and, when ablated, per layer the best head
    kept alone and the head whose removal raises the loss most."""
    if "rollout_min" not in entry:
        return []
    lines = [
        f"Loss {_fmt(entry.get('loss'), '{:.4f}')}; attention rollout min share at the sink "
        f"{_fmt(entry['rollout_min'], '{:.3f}', 100.0)}% (learned head weights), "
        f"{_fmt(entry.get('rollout_min_mean_heads'), '{:.3f}', 100.0)}% (mean of heads).",
        "",
        "| layer | rollout min % | ρ(rollout, fidelity) | accuracy synergy, points | best head alone: accuracy % "
        "| most needed head (largest loss without it): accuracy without it % | ρ(β, loss increase without the head) |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for layer in entry["layers"]:
        ablation = layer.get("ablation")
        best = needed = "-"
        if ablation:
            only, without = ablation["accuracy_only"], ablation["accuracy_without"]
            h = max(range(len(only)), key=only.__getitem__)
            best = f"head {h}: {100 * only[h]:.2f}"
            losses = ablation["loss_without"]
            h = max(range(len(losses)), key=losses.__getitem__)  # the costliest removal, by loss
            needed = f"head {h}: {100 * without[h]:.2f}"
        lines.append(
            f"| {layer['layer']} | {_fmt(layer.get('rollout_min'), '{:.3f}', 100.0)} "
            f"| {_fmt(layer.get('rollout_fidelity_spearman'), '{:.2f}')} "
            f"| {_fmt(layer.get('accuracy_synergy'), '{:.2f}', 100.0)} | {best} | {needed} "
            f"| {_fmt(layer.get('head_weight_ablation_spearman'), '{:.2f}')} |"
        )
    return lines + [""]
