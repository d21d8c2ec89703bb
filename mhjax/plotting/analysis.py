"""`mhjax analyze`'s Markdown and figure: per-layer mixing time and minimax fidelity of each model."""

from __future__ import annotations

import numpy as np

from mhjax.plotting.heads import member_lines
from mhjax.plotting.style import pyplot


def _entries(result: dict) -> list[tuple[str, dict]]:
    if "members" in result:
        return list(result["members"].items())
    label = f"{result.get('heads')} heads, {result.get('task')}"
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
            f"{e['heads']} heads, task {e['task']}, {e['num_sequences']} sequences of length {e['seq_len']}{status}. "
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
    """Mixing time and minimax fidelity per layer (mean ± std over sequences), one series per model."""
    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    entries = _entries(result)
    fig, (ax_mix, ax_fid) = plt.subplots(1, 2, figsize=(11, 4.2))
    n = len(entries)
    width = 0.6 / max(n, 1)
    for k, (label, e) in enumerate(entries):
        x = np.array([layer["layer"] for layer in e["layers"]], float) + (k - (n - 1) / 2) * width
        mix = [layer["mixing_time_mean"] for layer in e["layers"]]
        mix_sd = [layer["mixing_time_std"] for layer in e["layers"]]
        fid = [layer["fidelity_pct_mean"] for layer in e["layers"]]
        fid_sd = [layer["fidelity_pct_std"] for layer in e["layers"]]
        ax_mix.errorbar(x, mix, yerr=mix_sd, marker="o", capsize=3, label=label)
        ax_fid.errorbar(x, fid, yerr=fid_sd, marker="o", capsize=3, label=label)
    ax_mix.set(xlabel="layer", ylabel="mixing time (steps to sink)", title="Mixing time (mean ± std)")
    ax_fid.set(xlabel="layer", ylabel="minimax fidelity (%)", title="Minimax fidelity (mean ± std)")
    for ax in (ax_mix, ax_fid):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    ax_fid.legend(fontsize="small", loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
