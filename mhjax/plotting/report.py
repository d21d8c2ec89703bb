"""Tables and figures of `mhjax report`: results per group of swept fields, training curves, and
mixing time, minimax fidelity and synergy per layer and head count."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from mhjax.io.results import number_text, params_text
from mhjax.plotting.architecture import ARCHITECTURE, architecture_axes, value_label
from mhjax.plotting.style import clipped_sd, heads_colours, heads_label, pyplot


def _num(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return float("nan")


def mean_sd(values, fmt: str = "{:.4g}", scale: float = 1.0) -> str:
    """'mean ± std' of the finite values (times ``scale``), the value alone for one or equal ones, '-' for none;
    each number as ``fmt``, in scientific notation below 1e-3 (io/results.number_text)."""
    vals = np.array([_num(v) * scale for v in values], float)
    vals = vals[np.isfinite(vals)]
    if vals.size == 0:
        return "-"
    if vals.size == 1 or np.all(vals == vals[0]):  # a constant drops its "± 0"
        return number_text(float(vals[0]), fmt)
    return f"{number_text(float(vals.mean()), fmt)} ± {number_text(float(vals.std()), fmt)}"


def field_value(member: dict, field: str):
    """A member's value of a swept field; ``task_params.pairs`` reads inside its task_params, and
    ``task_params`` is the text of them all (``cap=2``; ``-`` for a task without parameters)."""
    if field == "task_params":
        return params_text(member.get("task_params"))
    head, _, rest = field.partition(".")
    if rest and head not in member:
        return None
    if rest:
        inner = member[head]
        return inner.get(rest) if isinstance(inner, dict) else None
    return member.get(field)


def task_label(entry: dict, arch=()) -> str:
    """A member's task with its parameters, e.g. ``recall (pairs=8)``, then its values of the
    architecture fields ``arch`` (``arch_fields``), e.g. ``copy, head_dim 16``."""
    if entry.get("task") is None:
        return ""
    params = entry.get("task_params") or {}
    inner = ", ".join(f"{k}={v}" for k, v in params.items())
    label = f"{entry['task']} ({inner})" if inner else str(entry["task"])
    return ", ".join([label] + [value_label(f, entry.get(f)) for f in arch])


def arch_fields(entries) -> list[str]:
    """The architecture fields whose values differ among ``entries``: task labels name them, so
    members of other architectures get rows and panels of their own (a head count at head_dim 16
    is not averaged with the same head count parameter-matched)."""
    return architecture_axes(list(entries), ARCHITECTURE)


def _group_members(members: list[dict], keys: tuple[str, ...]) -> dict:
    groups = defaultdict(list)
    for m in members:
        groups[tuple(field_value(m, k) for k in keys)].append(m)
    return dict(
        sorted(
            groups.items(),
            key=lambda kv: tuple(str(x) if not isinstance(x, (int, float)) else f"{x:020.6f}" for x in kv[0]),
        )
    )


_LABELS = {
    "eval_accuracy": "held-out accuracy %",
    "eval_loss": "held-out loss",
    "train_loss": "training loss",
    "program_wall_time_s": "program wall time s",
}
# the rest: in "Every member"; bits: text's (data/text.py)
_SUMMARY_ENDINGS = ("_loss", "_accuracy", "margin", "fidelity", "mixing_time", "_bits", "_per_byte", "_per_token")


def group_keys(members: list[dict], sweep_fields: list[str] | None = None) -> tuple[str, ...]:
    """Fields that tell head counts (and tasks, sizes, ...) apart: the swept fields except the seed."""
    fields = [
        f
        for f in (sweep_fields or ("task", "heads"))
        if f != "seed"
        and any(field_value(m, f) is not None for m in members)
        and (f in ("task", "task_params", "heads") or len({str(field_value(m, f)) for m in members}) > 1)
    ]
    # task, its parameters, heads first; config order after
    return tuple(sorted(fields, key=lambda f: (f != "task", not f.startswith("task_params"), f != "heads")))


def _summary_metrics(members: list[dict], keys) -> list[str]:
    seen: dict[str, None] = {}
    for m in members:
        for k, v in m.items():
            if k in keys or k == "seed" or isinstance(v, bool) or not isinstance(v, (int, float, type(None))):
                continue
            sizes = k in ("params", "gflop_per_step") and "gflop_per_step" in m  # an architecture sweep's
            if k in _LABELS or sizes or (k.endswith(_SUMMARY_ENDINGS) and "_over_" not in k):
                seen[k] = None
    metrics = [k for k in _LABELS if k in seen and k != "program_wall_time_s"] + [k for k in seen if k not in _LABELS]
    return metrics + (["program_wall_time_s"] if "program_wall_time_s" in seen else [])


def summary_table(members: list[dict], sweep_fields: list[str] | None = None) -> str:
    """Per group of swept fields (task, heads, ...; not the seed): mean ± std over seeds of the final
    metrics, diverged members left out (``members`` counts those kept, and says how many were not)."""
    keys = group_keys(members, sweep_fields)
    if not keys:
        return ""
    metrics = [
        (k, _LABELS.get(k, k.replace("_", " ") + (" %" if "accuracy" in k else "")))
        for k in _summary_metrics(members, keys)
    ]
    lines = [
        "| " + " | ".join(list(keys) + ["members"] + [label for _, label in metrics]) + " |",
        "|" + "---|" * len(keys) + "---:|" + "---:|" * len(metrics),
    ]
    for key, group in _group_members(members, keys).items():
        diverged = sum(1 for m in group if m.get("status") == "diverged")
        count = f"{len(group) - diverged}" + (f" (+{diverged} diverged, left out)" if diverged else "")
        group = [m for m in group if m.get("status") != "diverged"]
        cells = [str(k) for k in key] + [count]
        for k, _ in metrics:
            if "accuracy" in k:
                cells.append(mean_sd([m.get(k) for m in group], "{:.2f}", 100.0))
            elif k in ("program_wall_time_s", "params"):  # params: a count, the same for every seed
                cells.append(mean_sd([m.get(k) for m in group], "{:.1f}" if k != "params" else "{:,.0f}"))
            else:
                cells.append(mean_sd([m.get(k) for m in group], "{:.4f}"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _analysis_by_task_heads(analysis: dict) -> dict:
    """{task: {heads: [member analysis entries]}}."""
    out: dict = defaultdict(lambda: defaultdict(list))
    arch = arch_fields(analysis.get("members", {}).values())
    for entry in analysis.get("members", {}).values():
        out[task_label(entry, arch)][entry.get("heads")].append(entry)
    return {t: dict(sorted(h.items())) for t, h in sorted(out.items(), key=lambda kv: str(kv[0]))}


def _layer_values(entries: list[dict], key: str, layer: int) -> list:
    return [e["layers"][layer][key] for e in entries if layer < len(e.get("layers", []))]


def analysis_tables(analysis: dict) -> str:
    conv = analysis.get("conventions") or {}
    lines = [
        f"Evaluated at step {analysis.get('step')} on {_first(analysis, 'num_sequences')} sequences of length "
        f"{_first(analysis, 'seq_len')}; mean ± std over seeds of the per-member means. Mixing time: expected steps "
        f"to the sink ({conv.get('chain')} chain, capped at {conv.get('max_steps')}); fidelity: minimax fidelity in % "
        f"(horizon {conv.get('horizon')}, sink included: {conv.get('include_sink')}); synergy: share of sequences on "
        "which the combined operator beats the best single head. Layers from 0.",
        "",
    ]
    for task, by_heads in _analysis_by_task_heads(analysis).items():
        num_layers = max(len(e["layers"]) for entries in by_heads.values() for e in entries)
        for n, (title, key, fmt, scale) in enumerate(
            (
                ("mixing time", "mixing_time_mean", "{:.3f}", 1.0),
                ("minimax fidelity %", "fidelity_pct_mean", "{:.2f}", 1.0),
                ("synergy: combined beats best head, % of sequences", "combined_beats_best_share", "{:.0f}", 100.0),
            )
        ):
            accuracy = ["accuracy %"] if n == 0 else []
            lines += [
                f"**{task}: {title}**",
                "",
                "| " + " | ".join(["heads"] + accuracy + [f"layer {l}" for l in range(num_layers)]) + " |",
                "|---:|" + "---:|" * (len(accuracy) + num_layers),
            ]
            for heads, entries in by_heads.items():
                cells = [str(heads)] + (
                    [mean_sd([e.get("accuracy") for e in entries], "{:.2f}", 100.0)] if n == 0 else []
                )
                cells += [mean_sd(_layer_values(entries, key, l), fmt, scale) for l in range(num_layers)]
                lines.append("| " + " | ".join(cells) + " |")
            lines.append("")
    return "\n".join(lines)


def _first(analysis: dict, key: str):
    for entry in analysis.get("members", {}).values():
        return entry.get(key)
    return None


# Figures ------------------------------------------------------------- #
# curves.png: plotting/curves.py


def _per_layer(ax, by_heads: dict, key: str, scale: float, colours: dict, bars: bool = False, high=np.inf):
    n = len(by_heads)
    for k, (heads, entries) in enumerate(by_heads.items()):
        num_layers = max(len(e["layers"]) for e in entries)
        layers = np.arange(num_layers)
        values = np.array([[scale * _num(e["layers"][l][key]) for l in layers] for e in entries], float)
        mean = np.nanmean(values, axis=0)
        sd = np.nanstd(values, axis=0) if len(entries) > 1 else None
        if bars:
            width = 0.8 / n
            x = layers + (k - (n - 1) / 2) * width
            ax.bar(x, mean, width, yerr=clipped_sd(mean, sd, 0, high), color=colours[heads], label=heads_label(heads))
            ax.plot(x, mean, ls="none", marker="o", ms=3, color=colours[heads], clip_on=False)  # a 0% bar shows too
        else:
            ax.errorbar(
                layers,
                mean,
                yerr=clipped_sd(mean, sd, 0, high),
                marker="o",
                capsize=3,
                color=colours[heads],
                label=heads_label(heads),
            )
    ax.set_xticks(np.arange(max(len(e["layers"]) for entries in by_heads.values() for e in entries)))
    ax.set_xlabel("layer")
    ax.grid(alpha=0.3)


def plot_mixing_fidelity(analysis: dict, path: str) -> bool:
    by_task = _analysis_by_task_heads(analysis)
    if not by_task:
        return False
    plt = pyplot()
    colours = heads_colours([h for by_heads in by_task.values() for h in by_heads])
    fig, axes = plt.subplots(len(by_task), 2, figsize=(10, 3.4 * len(by_task)), squeeze=False)
    for r, (task, by_heads) in enumerate(by_task.items()):
        _per_layer(axes[r][0], by_heads, "mixing_time_mean", 1.0, colours)
        axes[r][0].set(ylabel="mixing time (steps to sink)", title=f"{task}: mixing time")
        _per_layer(axes[r][1], by_heads, "fidelity_pct_mean", 1.0, colours, high=100.0)
        axes[r][1].set(ylabel="minimax fidelity %", title=f"{task}: minimax fidelity")
    fig.tight_layout()
    legend = {}  # every head count once, right of the panels
    for ax in axes[:, 1]:
        for handle, text in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(text, handle)
    fig.legend(legend.values(), legend.keys(), loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True


def plot_synergy(analysis: dict, path: str) -> bool:
    """Bars per layer and head count of more than one head (with one, the combined operator is that
    head: it never beats it, and a bar of 0 would stand for nothing)."""
    every = _analysis_by_task_heads(analysis)
    colours = heads_colours([h for by_heads in every.values() for h in by_heads])  # as in the other figures
    by_task = {task: {h: entries for h, entries in by_heads.items() if h != 1} for task, by_heads in every.items()}
    by_task = {task: by_heads for task, by_heads in by_task.items() if by_heads}
    if not by_task:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(1, len(by_task), figsize=(5 * len(by_task), 3.4), squeeze=False)
    for c, (task, by_heads) in enumerate(by_task.items()):
        ax = axes[0][c]
        _per_layer(ax, by_heads, "combined_beats_best_share", 100.0, colours, bars=True, high=100.0)
        ax.set(ylabel="% of sequences", ylim=(0, 100))
        ax.set_title(task, fontsize="medium")  # the task alone: a long title runs into the next panel's
        ax.legend(fontsize="small")
    fig.suptitle("combined operator beats the best single head (% of sequences)", fontsize="medium")
    fig.tight_layout()
    if any(1 in by_heads for by_heads in every.values()):
        fig.text(0.01, -0.01, "1 head not shown: its combined operator is that head.", fontsize="small", va="top")
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True
