"""The report of a sweep (``mhjax report --workdir W``): a Markdown summary that reads well on GitHub.

Reads ``W/results.json`` (required), the members' TensorBoard scalars ``W/tb/<member>``
(with tensorboard's EventAccumulator; no TensorFlow) and ``W/analysis/analysis.json`` when
``mhjax analyze --workdir W`` has been run, and writes ``W/report.md`` with figures under
``W/report/``:

* ``curves.png``: training loss, held-out loss and held-out accuracy against steps, one line
  per member, coloured by head count;
* ``mixing_fidelity.png``: mixing time and minimax fidelity per layer, per head count
  (mean over seeds);
* ``synergy.png``: the share of sequences on which the combined operator's fidelity beats the
  best single head, per layer and head count;
* a sweep over architecture axes (plotting/architecture.py): accuracy, fidelity and synergy
  against heads, one line per value of the first axis and one panel per value of the second,
  and accuracy against parameters;
* after ``mhjax analyze --steps``, the same over training steps, per-head importance and held-out
  accuracy against steps (plotting/steps.py).

Any other experiment (e.g. the mixture sweep) gets the generic tables and the curves; the
PNG figures an experiment writes at the top of ``W`` are embedded as they are.
"""

from __future__ import annotations

import glob
import os
from functools import partial

from mhjax.analysis.comparisons import tuned_axes
from mhjax.config import ConfigError
from mhjax.io.results import diverged_lines, markdown_table, write_text
from mhjax.io.workdir import Workdir
from mhjax.plotting.architecture import architecture_figures
from mhjax.plotting.budget import plot_budget
from mhjax.plotting.curves import plot_curves
from mhjax.plotting.heads import head_tables
from mhjax.plotting.paired import paired_tables, unit_of
from mhjax.plotting.positions import plot_accuracy_by_position
from mhjax.plotting.report import (
    analysis_tables,
    plot_mixing_fidelity,
    plot_synergy,
    summary_table,
)
from mhjax.plotting.steps import (
    by_step,
    chosen_member,
    members_with_ablation,
    plot_accuracy_steps,
    plot_head_importance_steps,
    plot_mixing_fidelity_steps,
    plot_synergy_steps,
)
from mhjax.workflows.analyze import changed_task_note
from mhjax.workflows.reproduction import reproduction_markdown
from mhjax.workflows.workdir import open_workdir


def training_curves(workdir: Workdir, names: list[str]) -> dict:
    """{member: {tag: (steps, values)}}: ``train/loss`` and every ``eval/...`` curve of the
    members' TensorBoard runs; no curves for a member without a TensorBoard run."""
    out = {}
    for name in names:
        found = workdir.curves(name) if workdir.has_curves(name) else {}
        out[name] = {t: c for t, c in found.items() if t == "train/loss" or t.startswith("eval/")}
    return out


# ---------------------------------------------------------------------- #
# The report
# ---------------------------------------------------------------------- #
def write_report(workdir, log=None, reference: str | None = None, importance_member: str | None = None) -> dict:
    """Write ``W/report.md`` and ``W/report/*.png``; returns {"md": path, "figures": [paths]}.
    ``workdir``: a path, Workdir or Opened (workflows/workdir.py), each of whose files is read once.
    ``reference``: a folder of released checkpoints to compare with (workflows/reproduction.py).
    ``importance_member``: the member whose per-head importance "Heads along training" draws
    (default: steps.chosen_member); one without head ablation at two analysed steps is a ConfigError."""
    opened = open_workdir(workdir)
    workdir = opened.files
    results = workdir.results()
    # no task code: a report reads files only (a task whose source is gone, or was __main__, is fine)
    members = results["members"]
    analysis = workdir.analysis() if workdir.has_analysis() else None
    if importance_member is not None:
        check_importance_member(analysis, importance_member)
    out_dir, link_dir = workdir.report_dir, os.path.relpath(workdir.report_dir, workdir.path)
    os.makedirs(out_dir, exist_ok=True)
    figures = []

    def figure(name, fn, *args):
        path = os.path.join(out_dir, name)
        if fn(*args, path):
            figures.append(path)
            return f"![{os.path.splitext(name)[0]}]({link_dir}/{name})"
        return None

    title = results.get("title", "mhjax sweep")
    lines = [f"# {title}", ""]
    resumed = results.get("resumed_from_step")
    backend = f", backend `{results['backend']}`" if results.get("backend") else ""
    lines += [
        f"{len(members)} members, {results.get('steps')} steps each{backend}"
        + (f", resumed from step {resumed}" if resumed else "")
        + ". "
        f"TensorBoard: `tensorboard --logdir {workdir.tensorboard_dir}`.",
        "",
    ]
    config = workdir.config()
    paired = paired_tables(
        members,
        workdir.window_sums,
        workdir.sweep_fields(),
        results.get("baselines"),
        tuned_axes(config),
        (config.get("model") or {}).get("vocab_size"),
        results.get("comparisons"),
    )
    if paired and tuned_axes(config):  # compare.tune: the answer first, the per-setting results after
        lines += [paired]
    summary = summary_table(members, workdir.sweep_fields())
    if summary:
        caption = "Final metrics; mean ± sd over seeds (here ± is the seeds' standard deviation, not a standard error)."
        lines += ["## Results", "", caption, "", summary]
    lines += diverged_lines(members)
    lines += [paired] if paired and not tuned_axes(config) else []
    unit, scale = unit_of(members)
    args = (members, workdir.sweep_fields(), tuned_axes(config), scale, unit)
    link = figure("budget.png", plot_budget, *args)
    if link:
        lines += [
            "## Expected best validation loss against the tuning budget",
            "",
            "Per head count, the expected lowest mean validation loss (over seeds) among n settings drawn at random "
            'from the trained grid (Dodge et al. 2019, "Show Your Work"; mhjax/analysis/comparisons.py); where the '
            "lines cross, the answer depends on how many settings were tried.",
            "",
            link,
            "",
        ]
    curves = training_curves(workdir, [m["name"] for m in members])
    kind = opened.kind  # the Experiment class: how its curves read (no plug-in code runs)
    draw = partial(
        plot_curves,
        styled=kind.curve_style,
        log_tags=kind.log_curves,
        coloured=kind.curve_colour,
        baselines=results.get("baselines"),
    )
    link = figure("curves.png", draw, members, curves)
    if link:
        lines += ["## Training curves", "", link, ""]
    link = figure("accuracy_by_position.png", plot_accuracy_by_position, members)
    if link:
        lines += ["## Held-out accuracy by position", "", "Mean over seeds; position 0 first.", "", link, ""]

    links = []  # a sweep over architecture axes: heads on the x-axis, a line per head size (...)
    for name, fn, args, caption in architecture_figures(members, analysis, workdir.sweep_fields()):
        link = figure(name, fn, *args)
        links += [f"{caption}.", "", link, ""] if link else []
    if links:
        lines += ["## Heads across architecture axes", "", "Mean ± std over seeds.", "", *links]

    analyzable = is_analyzable(results)
    if analyzable or analysis is not None:
        lines += ["## Attention as a DAG: mixing time, fidelity and synergy", ""]
    if analysis is None:
        if analyzable:
            lines += [
                f"No analysis yet: run `mhjax analyze --workdir {workdir}` and then `mhjax report --workdir {workdir}` "
                "again to add mixing time, minimax fidelity and synergy per layer and head count.",
                "",
            ]
    else:
        lines += [f"{note}\n" for note in analysis_notes(analysis, results, workdir)]
        lines += [analysis_tables(analysis), ""]
        lines += [head_tables(analysis), ""]  # empty for an analysis without ablation and rollout
        for name, fn in (("mixing_fidelity.png", plot_mixing_fidelity), ("synergy.png", plot_synergy)):
            link = figure(name, fn, analysis)
            if link:
                lines += [link, ""]
        lines += _steps_section(analysis, members, curves, figure, workdir.sweep_fields(), importance_member)

    if reference is not None:
        more, paths = reproduction_markdown(workdir, reference, out_dir, link_dir)
        lines, figures = lines + more, figures + paths

    extra = sorted(glob.glob(workdir.file("*.png")))
    if extra:
        lines += ["## Experiment figures", ""]
        lines += [f"![{os.path.splitext(os.path.basename(p))[0]}]({os.path.basename(p)})" for p in extra] + [""]
        figures += extra  # embedded as they are: counted with the report's own

    lines += ["## Every member", "", markdown_table(members, "Members").split("\n", 2)[2]]
    path = workdir.report_path
    write_text(path, "\n".join(lines).rstrip() + "\n")
    if log is not None:
        log(f"wrote {path} and {len(figures)} figure(s) in {out_dir}")
    stale = analysis is not None and _stale(analysis, results)
    return {
        "md": path,
        "figures": figures,
        "analysis": analysis is not None,
        "needs_analysis": analysis is None and analyzable,
        # {"analysis": its step, "results": theirs} when analysis.json is of another step, else None
        "stale_analysis": {"analysis": analysis.get("step"), "results": results.get("steps")} if stale else None,
    }


def _steps_section(analysis, members, curves, figure, sweep_fields, importance_member=None) -> list[str]:
    """ "Heads along training": the figures over the steps analysed (plotting/steps.py), when more
    than one step was (``mhjax analyze --steps``)."""
    steps = by_step(analysis)
    if len(steps) < 2:
        return []
    chosen = importance_member or chosen_member(analysis)
    lines = [
        "## Heads along training",
        "",
        f"Analysed at steps {', '.join(map(str, steps))} (`mhjax analyze --steps`); one line per swept configuration "
        "(task, its parameters, architecture, heads, learning rate: every swept field but the seed), the mean over "
        f"its seeds only. Per-head importance: the loss with each head removed, for `{chosen}` "
        "(`mhjax report --importance-member NAME` draws another).",
        "",
    ]
    for name, fn, args in (
        ("steps_mixing_fidelity.png", partial(plot_mixing_fidelity_steps, sweep_fields=sweep_fields), (analysis,)),
        ("steps_synergy.png", partial(plot_synergy_steps, sweep_fields=sweep_fields), (analysis,)),
        ("steps_head_importance.png", partial(plot_head_importance_steps, member=chosen), (analysis,)),
        ("steps_accuracy.png", partial(plot_accuracy_steps, sweep_fields=sweep_fields), (members, curves)),
    ):
        link = figure(name, fn, *args)
        if link:
            lines += [link, ""]
    return lines


def check_importance_member(analysis: dict | None, name: str) -> None:
    """``name`` when analysis.json holds its head ablation at two or more steps, else a one-line ConfigError."""
    ablated = members_with_ablation(analysis)
    if name not in ablated:
        listed = ", ".join(ablated) or "none: run `mhjax analyze --workdir W --steps all` with ablation"
        raise ConfigError(
            f"--importance-member: {name!r} has no head ablation at two or more analysed steps "
            f"(members that have: {listed})"
        )


def _stale(analysis: dict, results: dict) -> bool:
    steps = analysis.get("step"), results.get("steps")
    return None not in steps and steps[0] != steps[1]


def stale_line(analysis_step, results_step, workdir, interface: str = "cli") -> str:
    """The line saying analysis.json is of another step than results.json, and how to refresh it."""
    how = f"`mhjax analyze --workdir {workdir}`" if interface == "cli" else "`run.analyze()`"
    return (
        f"The analysis is of step {analysis_step} but the results are of step {results_step}: "
        f"run {how} to analyse step {results_step}."
    )


def analysis_notes(analysis: dict, results: dict, workdir) -> list[str]:
    """report.md's lines above the analysis tables: an analysis of another step than the results
    (stale_line, with both interfaces' ways to refresh it), a changed task allowed, the members not
    analysed yet (an analysis of some members, ``--members``), tasks --sequences did not apply to."""
    notes = []
    if _stale(analysis, results):
        line = stale_line(analysis.get("step"), results.get("steps"), workdir)
        notes.append(f"**Stale analysis:** {line[:-1]} (Python: `run.analyze()`).")
    note = changed_task_note(analysis)
    notes += [note] if note else []
    missing = [m["name"] for m in results.get("members", []) if m.get("name") not in analysis.get("members", {})]
    if missing and analysis.get("members"):  # analysed with --members: some only
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        notes.append(
            f"**Some members analysed:** {len(analysis['members'])} of {len(results['members'])}; not yet {shown} "
            f"(`mhjax analyze --workdir {workdir} --members GLOB` merges more)."
        )
    if analysis.get("sequences_note"):
        notes.append(analysis["sequences_note"])
    return notes


def is_analyzable(results: dict) -> bool:
    """Whether `mhjax analyze --workdir` applies: recorded by the trainer; results written before it
    recorded that are judged by their members having a task (copy/cycle/zero)."""
    if "analyzable" in results:
        return bool(results["analyzable"])
    return bool(results["members"]) and all("task" in m for m in results["members"])
