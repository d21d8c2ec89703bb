"""report.md's expected best validation loss against the tuning budget (Dodge et al. 2019, "Show
Your Work: Improved Reporting of Experimental Results"): per comparison group, a line per head
count, the expected lowest mean validation loss among n settings of the tuned axes drawn from the
trained grid (analysis/comparisons.expected_best), n = 1..N; no extra training. Where the lines
cross, which head count looks best depends on how many settings were tried."""

from __future__ import annotations

from mhjax.analysis.comparisons import budget_curves
from mhjax.plotting.style import pyplot


def plot_budget(members: list[dict], fields, tuned, scale: float, unit: str, path: str) -> bool:
    """The figure at ``path`` (False, nothing written, without a tuned axis or validation losses)."""
    curves = budget_curves(members, fields, tuned) if tuned else {}
    if not curves:
        return False
    plt = pyplot()
    fig, axes = plt.subplots(1, len(curves), figsize=(4.6 * len(curves), 3.4), squeeze=False)
    for ax, (group, by_heads) in zip(axes.flat, sorted(curves.items(), key=str)):
        for heads, values in sorted(by_heads.items(), key=lambda kv: kv[0] if kv[0] is not None else -1):
            n = list(range(1, len(values) + 1))
            ax.plot(n, [v * scale for v in values], marker="o", label=f"{heads} head(s)")
        label = ", ".join(str(v) for v in group) or "all members"
        ax.set(
            xlabel=f"settings of {' x '.join(tuned)} tried (n)",
            ylabel=f"expected best validation loss ({unit})",
            title=label,
        )
        ax.set_xticks(n)
        ax.grid(alpha=0.3)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True
