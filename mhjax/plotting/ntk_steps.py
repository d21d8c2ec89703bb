"""The NTK margin along training (a mixture sweep's ``run.analyze(steps=...)`` at snapshot steps):
one line per head count, the mean over seeds, a line style per value of the other swept fields."""

from __future__ import annotations

import numpy as np

from mhjax.plotting.style import heads_colours, heads_label, pyplot

STYLES = ("-", "--", ":", "-.")


def plot_margin_steps(records: list[dict], members: list[dict], fields, path: str, key: str = "ntk_margin") -> bool:
    """``records``: run.analyze(steps=...)'s, one per (member, step); ``members``: results.json's;
    ``fields``: the swept fields (heads and seed aside, each other one's values get a line style).
    False (nothing drawn) with fewer than two steps."""
    by_name = {m["name"]: m for m in members}
    others = [f for f in fields if f not in ("heads", "seed")]
    lines = {}  # {(other values, heads): {step: [margins]}}
    for r in records:
        member = by_name.get(r.get("member"))
        if member is None or r.get(key) is None or not np.isfinite(r[key]):
            continue
        group = (tuple(member.get(f) for f in others), member["heads"])
        lines.setdefault(group, {}).setdefault(int(r["step"]), []).append(float(r[key]))
    if len({s for steps in lines.values() for s in steps}) < 2:
        return False
    plt = pyplot()
    colours = heads_colours([h for _, h in lines])
    variants = sorted({o for o, _ in lines}, key=str)
    fig, ax = plt.subplots(figsize=(6.4, 4))
    for (other, heads), steps in sorted(lines.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])):
        xs = sorted(steps)
        label = heads_label(heads) + "".join(f", {f}={v}" for f, v in zip(others, other) if len(variants) > 1)
        style = STYLES[variants.index(other) % len(STYLES)]
        ax.plot(xs, [np.mean(steps[s]) for s in xs], style, marker="o", ms=3, color=colours[heads], label=label)
    positive = sorted({s for steps in lines.values() for s in steps if s > 0})
    if len(positive) > 1 and positive[-1] >= 100 * positive[0]:
        ax.set_xscale("symlog", linthresh=1)
    ax.set(xlabel="step k", ylabel="NTK margin", title="NTK margin along training (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return True
