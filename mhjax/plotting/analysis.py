"""`mhjax analyze`'s Markdown and figure: per-layer mixing time and minimax fidelity of each model."""

from __future__ import annotations

import numpy as np

from mhjax.plotting.heads import member_lines
from mhjax.plotting.report import arch_fields, task_label
from mhjax.plotting.style import clipped_sd, heads_colours, heads_label, pyplot


def _entries(result: dict) -> list[tuple[str, dict]]:
    if "members" in result:
        return list(result["members"].items())
    label = f"{heads_label(result.get('heads'))}, {result.get('task')}"
    return [(label, result)]


def format_analysis(result: dict) -> str:
    """Markdown: accuracy and a per-layer table for each analysed model."""
    conv = result.get("conventions") or {}
    lines = ["# mhjax analyze", ""]
    if "workdir" in result:
        lines.append(f"Sweep `{result['workdir']}` at step {result['step']}.")
    elif "source" in result:
        lines.append(f"Checkpoint `{result['source'].get('torch_checkpoint')}`.")
    lines += [
        "",
        f"Learned head weights; fidelity = minimax fidelity in percent (horizon {conv.get('horizon')}, "
        f"include_sink={conv.get('include_sink')}); mixing time = exact expected steps to the sink "
        f"({conv.get('chain')} chain, capped at {conv.get('max_steps')}). Mean ± std over sequences; layers from 0.",
        "",
    ]
    for label, e in _entries(result):
        status = f", status {e['status']}" if e.get("status", "ok") != "ok" else ""
        lines += [
            f"## {label}",
            "",
            f"{heads_label(e['heads'])}, task {e['task']}, {e['num_sequences']} sequences of length "
            f"{e['seq_len']}{status}. "
            f"Token accuracy {100 * e['accuracy']:.2f}% "
            f"({100 * e['accuracy_excluding_first']:.2f}% excluding position 0).",
            "",
            "| layer | mixing time | fidelity % | best single head % | combined > best | head weights |",
            "|---:|---:|---:|---:|---:|:---|",
        ]
        for layer in e["layers"]:
            weights = ", ".join(f"{w:.3f}" for w in layer["head_weights"])
            lines.append(
                f"| {layer['layer']} | {layer['mixing_time_mean']:.4f} ± {layer['mixing_time_std']:.4f} "
                f"| {layer['fidelity_pct_mean']:.3f} ± {layer['fidelity_pct_std']:.3f} "
                f"| {layer['best_single_fidelity_pct_mean']:.3f} "
                f"| {100 * layer['combined_beats_best_share']:.0f}% | {weights} |"
            )
        lines.append("")
        lines += member_lines(e)
    return "\n".join(lines)


def plot_analysis(result: dict, path: str) -> None:
    """Mixing time and minimax fidelity per layer (mean ± std over sequences, fidelity's band kept
    inside [0, 100]): a row per task, task parameter values (``cap=2`` and ``cap=4`` are two rows)
    and architecture values (head_dim 8 and 16), a colour per head count (plotting/style.py), a
    line style per seed; the legend right of the panels."""
    plt = pyplot()
    entries = [e for _, e in _entries(result)]
    arch = arch_fields(entries)  # members of other architectures: rows of their own
    tasks = sorted({task_label(e, arch) for e in entries})
    colours = heads_colours(e.get("heads") for e in entries)
    seeds = sorted({e.get("seed") for e in entries}, key=str)
    layers = np.arange(max(len(e["layers"]) for e in entries))
    styles = ["-", "--", ":", "-."]
    fig, axes = plt.subplots(len(tasks), 2, figsize=(10, 3.6 * len(tasks)), squeeze=False)
    offsets = {h: (k - (len(colours) - 1) / 2) * 0.5 / max(len(colours), 1) for k, h in enumerate(colours)}
    labelled = set()
    for row, task in enumerate(tasks):
        ax_mix, ax_fid = axes[row]
        for e in sorted(
            (e for e in entries if task_label(e, arch) == task), key=lambda e: (e.get("heads"), str(e.get("seed")))
        ):
            heads = e.get("heads")
            x = np.array([layer["layer"] for layer in e["layers"]], float) + offsets[heads]
            style = dict(
                marker="o",
                capsize=3,
                color=colours[heads],
                ls=styles[seeds.index(e.get("seed")) % len(styles)],
                label=None if heads in labelled else heads_label(heads),
            )
            labelled.add(heads)
            for ax, key, bounds in ((ax_mix, "mixing_time", (0, np.inf)), (ax_fid, "fidelity_pct", (0, 100))):
                mean = np.array([layer[f"{key}_mean"] for layer in e["layers"]], float)
                sd = np.array([layer[f"{key}_std"] for layer in e["layers"]], float)
                ax.errorbar(x, mean, yerr=clipped_sd(mean, sd, *bounds), **style)
                style["label"] = None
        ax_mix.set(xlabel="layer", ylabel="mixing time (steps to sink)", title=f"{task}: mixing time (mean ± std)")
        ax_fid.set(xlabel="layer", ylabel="minimax fidelity (%)", title=f"{task}: minimax fidelity (mean ± std)")
        for ax in (ax_mix, ax_fid):
            ax.set_xticks(layers)  # the layers, never a fraction (one layer: the tick 0 alone)
            ax.set_xlim(-0.5, len(layers) - 0.5)
            ax.grid(alpha=0.3)
    fig.tight_layout()
    legend_title = "seeds: line style" if len(seeds) > 1 else None
    fig.legend(loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize="small", title=legend_title)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
