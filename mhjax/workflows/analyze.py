"""Analysing trained models (``mhjax analyze``, ``Run.analyze``): a released checkpoint or every
member of a trained sweep.

The metrics themselves are in :mod:`mhjax.analysis.metrics`; this module finds the models
(the safe torch reader, a workdir's latest checkpoint), writes analysis.json/.md/.png and logs
to the members' TensorBoard runs."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from mhjax.analysis import tags
from mhjax.analysis.metrics import analyze_checkpoint, analyze_params, one_line, task_sequences
from mhjax.config import ConfigError
from mhjax.data import tasks
from mhjax.io.results import write_json, write_text
from mhjax.io.tensorboard import log_to_run
from mhjax.io.workdir import Workdir, analysis_paths
from mhjax.models.probe import model_sizes
from mhjax.plotting.analysis import format_analysis, plot_analysis
from mhjax.plotting.images import attention_grid, sink_row_image
from mhjax.train.engine import unstack
from mhjax.train.loop import Sweep
from mhjax.workflows.workdir import Opened, open_workdir


def analyze_torch_checkpoint(
    path,
    heads: int,
    task: str,
    out=None,
    sequences=None,
    num_sequences: int = 50,
    seed: int = 0,
    *,
    plot: bool = True,
    **kwargs,
) -> dict:
    """:func:`mhjax.analysis.metrics.analyze_checkpoint`, and ``out/analysis.{json,md,png}`` if ``out``."""
    result = analyze_checkpoint(path, heads, task, sequences, num_sequences, seed, **kwargs)
    if out is not None:
        result["files"] = write_analysis(out, result, plot=plot)
    return result


def _restore_sweep(opened: Opened, allow_changed_task: bool = False):
    """(experiment, Sweep, latest step, states) restored from a trained sweep workdir; a plug-in
    task whose source file changed since training is refused unless ``allow_changed_task``."""
    workdir = opened.files
    if not opened.kind.analyzable:  # before any plug-in code runs
        hint = "; run.analyze(steps=...) from Python analyzes its states" if opened.kind.analyzes_states else ""
        raise ConfigError(
            f"--workdir: analyze needs a sequence sweep; {workdir} holds a {opened.kind.kind!r} sweep{hint}"
        )
    opened.restore_tasks(allow_changed=bool(allow_changed_task))
    experiment = opened.experiment()  # plug-in tasks restored from where they came
    if not workdir.has_checkpoints():
        raise ConfigError(f"--workdir: {workdir} has no {os.path.basename(workdir.checkpoints_dir)}/; train it first")
    checkpointer = workdir.checkpointer()
    try:
        step = checkpointer.latest_step()
        if step is None:
            raise ConfigError(f"--workdir: {workdir} has no checkpoint yet; train it first")
        sweep = Sweep(experiment)
        states, _ = sweep.restore(checkpointer, step)
        return experiment, sweep, step, states
    except ConfigError as exc:
        raise ConfigError(f"--workdir: {one_line(exc)}") from None
    finally:
        checkpointer.close()


def member_params(sweep, states) -> dict[int, Any]:
    """Member index -> its own (unstacked) param tree."""
    return unstack(sweep.programs, {name: state.params for name, state in states.items()})


def analyze_workdir(
    workdir,
    out=None,
    sequences=None,
    num_sequences: int = 50,
    seed: int = 0,
    *,
    tensorboard: bool = True,
    plot: bool = True,
    log=None,
    allow_changed_task: bool = False,
    **kwargs,
) -> dict:
    """Analyse every member of a trained sequence sweep (latest checkpoint); a plug-in task whose
    source file changed since training is refused unless ``allow_changed_task``.

    Writes ``out/analysis.{json,md,png}`` (default ``out = W/analysis``) with one
    object per member under ``"members"`` (keyed by member name), and, unless
    ``tensorboard=False``, logs ``analysis/...`` scalars and per-layer attention
    heatmaps (all heads + the combined operator, evaluation sequence 0) to each
    member's run ``W/tb/<member>`` at the checkpoint's step.
    """
    opened = open_workdir(workdir)
    workdir = opened.files
    experiment, sweep, step, states = _restore_sweep(opened, allow_changed_task)
    m = experiment.config.model
    batches = {}  # {task_id: (its evaluation Batch, source)}: one per task and parameter values
    member_states = sweep.member_states(states)
    members = {}
    for member in experiment.members:
        state = member_states[member.name]
        task_id = int(experiment.member_constants(member).task_id)
        task = experiment.tasks[task_id]  # the member's task with its parameters bound
        if task_id not in batches:
            batches[task_id] = task_sequences(task, sequences, num_sequences, seed, m.seq_len, m.vocab_size)
        batch, source = batches[task_id]
        sizes = model_sizes(state.params)  # the member's own (architecture axes: experiments/architecture.py)
        res = analyze_params(state.params, member["heads"], task, batch, sizes, keep_attention=tensorboard, **kwargs)
        attention, combined = res.pop("attention", None), res.pop("combined", None)
        sink_rows = res.pop("rollout_sink_row", None)
        entry = {
            "name": member.name,
            **{k: v for k, v in member.hparams.items()},
            "status": "diverged" if bool(state.diverged) else "ok",
            **res,
        }
        members[member.name] = entry
        if log is not None:
            log(f"{member.name}: accuracy {res['accuracy']:.4f}")
        if tensorboard:
            scalars, images = _tensorboard_entry(entry, attention, combined)
            scalars.update(_head_scalars(entry))
            if sink_rows is not None:
                images[tags.ROLLOUT_SINK_ROW] = sink_row_image(sink_rows)
            log_to_run(workdir.run_dir(member.name), scalars, images, step)
    recorded = opened.recorded_tasks()
    hashes = {name: tasks.source_hashes(recorded.get(name)) for name in sorted({m["task"] for m in experiment.members})}
    result = {
        "workdir": os.path.abspath(workdir.path),
        "step": int(step),
        "source": source if batches else None,
        "conventions": next(iter(members.values()))["conventions"] if members else None,
        # whether a task source changed since training was allowed; each plug-in task's sha256
        # {"recorded": at training, "current": at this analysis}
        "allow_changed_task": bool(allow_changed_task),
        "task_sha256": {name: h for name, h in hashes.items() if h},
        "members": members,
    }
    out = workdir.analysis_dir if out is None else str(out)
    result["files"] = write_analysis(out, result, plot=plot)
    return result


def _tensorboard_entry(entry: dict, attention, combined) -> tuple[dict, dict]:
    """(scalars ``analysis/accuracy``, ``analysis/layer{l}/...``; heatmaps ``analysis/attention/layer{l}``)."""
    scalars = {tags.ACCURACY: entry["accuracy"], tags.ACCURACY_EXCLUDING_FIRST: entry["accuracy_excluding_first"]}
    images = {}
    for layer in entry["layers"]:
        l = layer["layer"]
        for key, name in tags.LAYER_METRICS.items():
            scalars[tags.layer_tag(l, name)] = layer[key]
        if attention is not None:
            images[tags.attention_tag(l)] = attention_grid(attention[l], None if combined is None else combined[l])
    return scalars, images


def _head_scalars(entry: dict) -> dict:
    """Head ablation and rollout scalars: ``analysis/loss``, ``analysis/rollout_min``,
    ``analysis/layer{l}/rollout_min`` and ``analysis/layer{l}/accuracy_synergy`` (when ablated)."""
    scalars = {tags.LOSS: entry["loss"], tags.ROLLOUT_MIN: entry["rollout_min"]}
    for layer in entry["layers"]:
        for key in tags.LAYER_HEAD_METRICS:
            if layer.get(key) is not None:
                scalars[tags.layer_tag(layer["layer"], key)] = layer[key]
    return scalars


def write_analysis(out, result: dict, plot: bool = True) -> dict[str, str]:
    """Write ``analysis.json``, ``analysis.md`` and (``plot``) ``analysis.png`` under ``out``."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out: cannot create {out} ({type(exc).__name__}: {one_line(exc)})") from None
    files = analysis_paths(out)
    if not plot:
        del files["png"]
    write_json(files["json"], {**{k: v for k, v in result.items() if k != "files"}, "files": files})
    markdown, note = format_analysis(result), changed_task_note(result)
    if note:  # under the title
        title, sep, rest = markdown.partition("\n\n")
        markdown = f"{title}{sep}{note}\n\n{rest}"
    write_text(files["md"], markdown)
    if plot:
        plot_analysis(result, files["png"])
    return files


def changed_task_note(analysis: dict) -> str | None:
    """One line when the analysis ran with a task source changed since training (allowed by
    --allow-changed-task / allow_changed_task=True), naming the task and both sha256; else None."""
    changed = [
        f"{name} (sha256 {h['recorded'][:12]} at training, {h['current'][:12]} at analysis)"
        for name, h in (analysis.get("task_sha256") or {}).items()
        if h.get("current") and h["current"] != h.get("recorded")
    ]
    if not (analysis.get("allow_changed_task") and changed):
        return None
    return (
        f"**Changed task allowed:** the source of task {', '.join(changed)} changed since training; "
        "this analysis used the edited code (allow_changed_task)."
    )


def sequences_text(source: dict, count: int, length: int, drawn: bool = False) -> str:
    """Which sequences the accuracy and metrics are measured on, in words; ``drawn``: some task
    samples its own sequences (not random tokens with targets read from them)."""
    if source.get("sequences") == "random":
        if drawn:
            return f"{count} sequences of length {length} drawn by each task's sampler (--seed {source.get('seed')})"
        return f"{count} random sequences of length {length} (--seed {source.get('seed')})"
    if source.get("sequences") == "array":
        return f"{count} given sequences of length {length}"
    return f"the {count} sequences of length {length} in {source.get('sequences')}"


def held_out_note(workdir: Workdir) -> str:
    """Why these accuracies differ from train's eval_accuracy (results.json, report)."""
    data = Workdir.of(workdir).config().get("data", {})
    held_out = f"{data['num_eval']} sequences" if "num_eval" in data else "sequences"
    return (
        f"train's eval_accuracy ({Workdir.RESULTS}, report) is the same token accuracy on the run's own held-out set, "
        f"{held_out} per task and seed: other samples, so the numbers differ a little"
    )
