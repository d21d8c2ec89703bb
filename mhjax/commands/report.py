"""`mhjax report --workdir W`: a Markdown summary of a sweep that reads well on GitHub.

Reads ``W/results.json`` (required), the members' TensorBoard scalars ``W/tb/<member>``
(with tensorboard's EventAccumulator; no TensorFlow) and ``W/analysis/analysis.json`` when
``mhjax analyze --workdir W`` has been run, and writes ``W/report.md`` with figures under
``W/report/``:

* ``curves.png``: training loss, held-out loss and held-out accuracy against steps, one line
  per member, coloured by head count;
* ``mixing_fidelity.png``: mixing time and minimax fidelity per layer, per head count
  (mean over seeds);
* ``synergy.png``: the share of sequences on which the combined operator's fidelity beats the
  best single head, per layer and head count.

Any other experiment (e.g. the mixture sweep) gets the generic tables and the curves; the
PNG figures an experiment writes at the top of ``W`` are embedded as they are.
"""

from __future__ import annotations

import glob
import json
import os
import sys

from mhjax.commands.reproduction import reproduction_markdown
from mhjax.config import ConfigError
from mhjax.data import tasks
from mhjax.io.curves import read_curves
from mhjax.io.lock import WorkdirLock
from mhjax.io.results import load_analysis, markdown_table, read_workdir_json
from mhjax.plotting.heads import head_tables
from mhjax.plotting.report import analysis_tables, plot_curves, plot_mixing_fidelity, plot_synergy, summary_table

REPORT_DIR = "report"


# ---------------------------------------------------------------------- #
# Reading
# ---------------------------------------------------------------------- #
def load_results(workdir: str) -> dict:
    results = read_workdir_json(
        workdir, "results.json", f"train it first (mhjax train --config ... --workdir {workdir})"
    )
    if not isinstance(results.get("members"), list):
        raise ConfigError(f"--workdir: {os.path.join(workdir, 'results.json')} has no member list")
    return results


def load_sweep_fields(workdir: str) -> list[str]:
    """The config's swept fields (from W/mhjax.json), or [] when unreadable."""
    try:
        with open(os.path.join(workdir, "mhjax.json")) as f:
            return list(json.load(f)["config"]["sweep"])
    except (OSError, ValueError, KeyError, TypeError):
        return []


def restore_tasks(workdir: str) -> None:
    """Register again the sweep's plug-in tasks from where W/mhjax.json says they came from
    (a source that is gone: a one-line error naming it); nothing for older workdirs."""
    path = os.path.join(workdir, "mhjax.json")
    try:
        with open(path) as f:
            recorded = json.load(f).get("tasks")
    except (OSError, ValueError, AttributeError):
        return
    tasks.restore(recorded, path)


def load_curves(workdir: str, names: list[str], tags=None) -> dict:
    """{member: {tag: (steps, values)}}; see mhjax.io.curves.read_curves."""
    return read_curves(workdir, names, tags)


# ---------------------------------------------------------------------- #
# Tables
# ---------------------------------------------------------------------- #
# The report
# ---------------------------------------------------------------------- #
def write_report(workdir: str, log=None, reference: str | None = None) -> dict:
    """Write ``W/report.md`` and ``W/report/*.png``; returns {"md": path, "figures": [paths]}.
    ``reference``: a folder of released checkpoints to compare with (mhjax.commands.reproduction)."""
    workdir = str(workdir)
    results = load_results(workdir)
    restore_tasks(workdir)
    members = results["members"]
    analysis = load_analysis(workdir)
    out_dir = os.path.join(workdir, REPORT_DIR)
    os.makedirs(out_dir, exist_ok=True)
    figures = []

    def figure(name, fn, *args):
        path = os.path.join(out_dir, name)
        if fn(*args, path):
            figures.append(path)
            return f"![{os.path.splitext(name)[0]}]({REPORT_DIR}/{name})"
        return None

    title = results.get("title", "mhjax sweep")
    lines = [f"# {title}", ""]
    resumed = results.get("resumed_from_step")
    backend = f", backend `{results['backend']}`" if results.get("backend") else ""
    lines += [
        f"{len(members)} members, {results.get('steps')} steps each{backend}"
        + (f", resumed from step {resumed}" if resumed else "")
        + ". "
        f"TensorBoard: `tensorboard --logdir {os.path.join(workdir, 'tb')}`.",
        "",
    ]
    summary = summary_table(members, load_sweep_fields(workdir))
    if summary:
        lines += ["## Results", "", "Final metrics; mean ± std over seeds.", "", summary]
    curves = load_curves(workdir, [m["name"] for m in members])
    link = figure("curves.png", plot_curves, members, curves)
    if link:
        lines += ["## Training curves", "", link, ""]

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
        lines += [analysis_tables(analysis), ""]
        lines += [head_tables(analysis), ""]  # empty for an analysis without ablation and rollout
        for name, fn in (("mixing_fidelity.png", plot_mixing_fidelity), ("synergy.png", plot_synergy)):
            link = figure(name, fn, analysis)
            if link:
                lines += [link, ""]

    if reference is not None:
        more, paths = reproduction_markdown(workdir, reference, out_dir, REPORT_DIR)
        lines, figures = lines + more, figures + paths

    extra = sorted(glob.glob(os.path.join(workdir, "*.png")))
    if extra:
        lines += ["## Experiment figures", ""]
        lines += [f"![{os.path.splitext(os.path.basename(p))[0]}]({os.path.basename(p)})" for p in extra] + [""]

    lines += ["## Every member", "", markdown_table(members, "Members").split("\n", 2)[2]]
    path = os.path.join(workdir, "report.md")
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")
    os.replace(tmp, path)
    if log is not None:
        log(f"wrote {path} and {len(figures)} figure(s) in {out_dir}")
    return {
        "md": path,
        "figures": figures,
        "analysis": analysis is not None,
        "needs_analysis": analysis is None and analyzable,
    }


def is_analyzable(results: dict) -> bool:
    """Whether `mhjax analyze --workdir` applies: recorded by the trainer; results written before it
    recorded that are judged by their members having a task (copy/cycle/zero)."""
    if "analyzable" in results:
        return bool(results["analyzable"])
    return bool(results["members"]) and all("task" in m for m in results["members"])


def command(args, overrides) -> int:
    with WorkdirLock(args.workdir, "report"):
        result = write_report(args.workdir, reference=args.reference)
    print(f"wrote {result['md']} ({len(result['figures'])} figures)")
    if result["needs_analysis"]:
        print(
            f"no analysis yet: `mhjax analyze --workdir {args.workdir}` adds mixing time, fidelity and synergy",
            file=sys.stderr,
        )
    return 0
