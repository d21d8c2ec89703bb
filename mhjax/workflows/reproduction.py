"""The sweep beside the paper's released models (``mhjax report --workdir W --reference DIR``).

Reproduces Section 4 of "Beyond Parallelism: Synergistic Computational Graph Effects in
Multi-Head Attention" (Sáez de Ocáriz Borde, arXiv 2507.02944): learning curves over seeds,
mixing time, minimax fidelity and synergy per task, layer and head count for the trained
sweep (W/analysis/analysis.json) beside the released checkpoint of the same task and head
count (analysed here on the same sequences, :mod:`mhjax.analysis.reference`), and the
paper's claims decided on both (:mod:`mhjax.analysis.claims`).
"""

from __future__ import annotations

import os

from mhjax.analysis import claims
from mhjax.analysis.reference import PAPER_STEPS, analyze_reference, evaluation_setup, find_checkpoints
from mhjax.io.workdir import Workdir
from mhjax.plotting.report import mean_sd
from mhjax.plotting.reproduction import CURVE_PANELS, plot_beside_released, plot_curve_bands

CACHE = "released.json"  # the released models' analysis, in the report folder
METRICS = (
    ("mixing time (expected steps to the sink)", "mixing_time_mean", "{:.2f}", 1.0),
    ("minimax fidelity %", "fidelity_pct_mean", "{:.2f}", 1.0),
    ("combined operator beats the best single head, % of sequences", "combined_beats_best_share", "{:.0f}", 100.0),
    ("accuracy synergy: full model minus the best single head kept alone, points", "accuracy_synergy", "{:.2f}", 100.0),
    ("attention rollout through the layer, min share at the sink %", "rollout_min", "{:.3f}", 100.0),
)


def learnt_steps(members: list[dict], curves: dict, seq_len: int) -> dict:
    """{member: first evaluation step at which held-out accuracy counts as learnt, or None}."""
    out = {}
    for m in members:
        steps, values = curves.get(m["name"], {}).get("eval/accuracy", ((), ()))
        out[m["name"]] = claims.learnt_step(steps, values, m.get("task"), seq_len)
    return out


def _accuracy_table(ours: list[dict] | None, results: list[dict], released: list[dict]) -> list[str]:
    lines = [
        "| task | heads | mhjax, evaluation sequences % | mhjax, held-out set % | released, evaluation sequences % |",
        "|---|---:|---:|---:|---:|",
    ]
    keys = sorted({(m["task"], m["heads"]) for m in results} | {(e["task"], e["heads"]) for e in released})
    for task, heads in keys:
        mine = [e["accuracy"] * 100 for e in ours or [] if (e["task"], e["heads"]) == (task, heads)]
        held = [
            100 * m["eval_accuracy"]
            for m in results
            if (m["task"], m["heads"]) == (task, heads) and m.get("eval_accuracy") is not None
        ]
        theirs = [e["accuracy"] * 100 for e in released if (e["task"], e["heads"]) == (task, heads)]
        lines.append(f"| {task} | {heads} | " + " | ".join(mean_sd(v, "{:.2f}") for v in (mine, held, theirs)) + " |")
    return lines + [""]


def _values(entries: list[dict], task: str, heads: int, layer: int, key: str, scale: float) -> list[float]:
    return [
        scale * e["layers"][layer][key]
        for e in entries
        if (e["task"], e["heads"]) == (task, heads)
        and layer < len(e["layers"])
        and e["layers"][layer].get(key) is not None  # an analysis from before a metric existed
    ]


def _layer_tables(ours: list[dict], released: list[dict]) -> list[str]:
    lines = []
    layers = range(max(len(e["layers"]) for e in ours + released))
    for task in sorted({e["task"] for e in ours + released}):
        heads = sorted({e["heads"] for e in ours + released if e["task"] == task})
        for title, key, fmt, scale in METRICS:
            header = " | ".join(f"layer {i} mhjax | layer {i} released" for i in layers)
            lines += [
                f"**{task}: {title}** (mhjax mean ± std over seeds | released)",
                "",
                f"| heads | {header} |",
                "|---:|" + "---:|---:|" * len(layers),
            ]
            for h in heads:
                cells = [
                    mean_sd(_values(group, task, h, i, key, scale), fmt) for i in layers for group in (ours, released)
                ]
                lines.append(f"| {h} | " + " | ".join(cells) + " |")
            lines.append("")
    return lines


RULES = [
    "How each claim is decided (`mhjax/analysis/claims.py`):",
    "",
    f"- **learnt**: held-out token accuracy (on the evaluation sequences) at least the task's ceiling minus "
    f"{100 * claims.MARGIN:.0f} point for every seed: 99% for copy; for cycle the ceiling is (T-1)/T (position 0's "
    "target is the last token, which a causal model cannot see), so 98% at T = 100.",
    "- **trend with H** (claims b-d, per layer for c and d): on the means over seeds across the head counts, the "
    "mean must move the claimed way from the fewest to the most heads by more than the sum of those two groups' "
    "seed standard deviations, and no step between neighbouring head counts may go the other way by more than the "
    "sum of their standard deviations. A released model is one seed: the standard error of its mean over the "
    "evaluation sequences stands in for the seed std. (c) and (d) hold "
    "when the trend holds in every layer (✓/✗ per layer in the detail, where ± is that std or standard error).",
    "- **(b)** uses the first evaluation step at which the held-out accuracy curve reaches *learnt* "
    "(a seed that never does counts as later than every step); the released checkpoints have no curves: *not judged*.",
    "- **(e)**: for every H >= 4, the share of sequences on which the combined operator's minimax fidelity is "
    "strictly above the best single head's, averaged over layers and seeds, is above 50%.",
    f"- **not yet**: trained for fewer than the paper's {PAPER_STEPS:,} steps and the task is not learnt by every "
    "head count; (a) cannot fail yet, and (c)-(e), which are about trained models, are not judged (the detail "
    "shows where the numbers stand).",
    "",
]


def _checklist(ours: list[claims.Verdict] | None, theirs: list[claims.Verdict], steps: int) -> list[str]:
    mine, other = {(v.claim, v.task): v for v in ours or []}, {(v.claim, v.task): v for v in theirs}
    missing = "-" if ours is not None else "run `mhjax analyze --workdir W`"
    lines = [f"| claim | task | mhjax, {steps:,} steps | released, {PAPER_STEPS:,} steps |", "|---|---|---|---|"]
    for claim, task in sorted(set(mine) | set(other)):  # claim letter, then task
        cells = [
            f"**{v.verdict}**: {v.detail}" if v else empty
            for v, empty in ((mine.get((claim, task)), missing), (other.get((claim, task)), "-"))
        ]
        lines.append(f"| ({claim}) {claims.CLAIMS[claim]} | {task} | {cells[0]} | {cells[1]} |")
    return lines + [""]


def reproduction_markdown(
    workdir, reference_dir: str, out_dir: str, link_dir: str = "report"
) -> tuple[list[str], list[str]]:
    """Markdown lines and written figure paths of the reproduction section (figures go to ``out_dir``,
    linked as ``link_dir/NAME.png``); ``workdir``: a Workdir (or its path). A missing or empty
    ``reference_dir`` is a ConfigError naming --reference."""
    find_checkpoints(reference_dir)  # fail before any work
    workdir = Workdir.of(workdir)
    results = workdir.results()
    members = results["members"]
    steps = int(results.get("steps") or max((m.get("steps", 0) for m in members), default=0))
    analysis = workdir.analysis() if workdir.has_analysis() else None
    vocab_size, seq_len = int(workdir.config_field("model.vocab_size")), int(workdir.config_field("model.seq_len"))
    tokens, conventions, how = evaluation_setup(workdir.path, analysis, vocab_size, seq_len)
    os.makedirs(out_dir, exist_ok=True)
    released = analyze_reference(reference_dir, tokens, conventions, cache=os.path.join(out_dir, CACHE))
    ours = (
        [e for e in (analysis or {}).get("members", {}).values() if e.get("status", "ok") == "ok"] if analysis else None
    )
    tags = [tag for tag, _, _ in CURVE_PANELS]
    curves = {m["name"]: workdir.curves(m["name"], tags) if workdir.has_curves(m["name"]) else {} for m in members}
    intro = (
        'The paper: "Beyond Parallelism: Synergistic Computational Graph Effects in Multi-Head Attention" '
        f"(arXiv 2507.02944), Section 4. Released models: `{reference_dir}` ({len(released)} checkpoints, "
        f"{PAPER_STEPS:,} steps, one seed each), evaluated on {how}, with the conventions of W's analysis ("
        + ", ".join(f"{k} {conventions[k]}" for k in ("horizon", "max_steps", "include_sink", "chain"))
        + f"). mhjax: {len(members)} members, {steps:,} steps."
    )
    figures, lines = [], ["## Reproduction beside the released checkpoints", "", intro, ""]

    def figure(name, fn, *args):
        path = os.path.join(out_dir, name)
        if fn(*args, path):
            figures.append(path)
            lines.extend([f"![{os.path.splitext(name)[0]}]({link_dir}/{name})", ""])

    lines += ["### Learning curves", "", "Mean ± std over seeds (band) per head count; losses on a log scale.", ""]
    figure("reproduction_curves.png", plot_curve_bands, members, curves)
    lines += [
        "### Held-out accuracy",
        "",
        "Token accuracy in eval mode. *Evaluation sequences*: the random sequences "
        "mhjax and the released models are both analysed on; *held-out set*: the config's evaluation set, "
        "scored along training (`eval/accuracy`). Mean ± std over seeds.",
        "",
    ]
    lines += _accuracy_table(ours, members, released)
    lines += ["### Mixing time, minimax fidelity and synergy per layer", ""]
    if ours is None:
        lines += [
            f"No analysis of the sweep yet: run `mhjax analyze --workdir {workdir}`, then this report again, to "
            "put mhjax's numbers beside the released models' and judge the claims for mhjax.",
            "",
        ]
    lines += _layer_tables(ours or [], released)
    figure("reproduction_layers.png", plot_beside_released, ours or [], released)
    learnt_at = learnt_steps(members, curves, seq_len) if any("eval/accuracy" in c for c in curves.values()) else None
    ours_verdicts = claims.check_claims(ours, steps, learnt_at) if ours else None
    theirs = claims.check_claims(released, PAPER_STEPS)
    lines += ["### The paper's claims", ""] + RULES + _checklist(ours_verdicts, theirs, steps)
    return lines, figures
