"""Analysing trained models (``mhjax analyze``, ``Run.analyze``): a released checkpoint or every
member of a trained sweep.

The metrics themselves are in :mod:`mhjax.analysis.metrics`; this module finds the models
(the safe torch reader, a workdir's latest checkpoint), writes analysis.json/.md/.png and logs
to the members' TensorBoard runs."""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import jax
import numpy as np

from mhjax.analysis import tags
from mhjax.analysis.metrics import analyze_checkpoint, analyze_params, check_task, one_line, task_sequences
from mhjax.config import ConfigError
from mhjax.data import tasks
from mhjax.io.results import json_ready, write_json, write_text
from mhjax.io.tensorboard import log_to_run
from mhjax.io.workdir import Workdir, analysis_paths
from mhjax.models.probe import model_sizes
from mhjax.plotting.analysis import format_analysis, plot_analysis
from mhjax.plotting.images import attention_grid, sink_row_image
from mhjax.train.engine import unstack
from mhjax.workflows.members import kept_steps
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


def _experiment(opened: Opened, allow_changed_task: bool = False):
    """The sweep's experiment, its plug-in tasks restored (a source changed since training is
    refused unless ``allow_changed_task``), once the workdir is known to hold a checkpoint."""
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
    if workdir.latest_step() is None:
        raise ConfigError(f"--workdir: {workdir} has no checkpoint yet; train it first")
    return experiment


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
    steps=None,
    members=None,
    **kwargs,
) -> dict:
    """Analyse the members of a trained sequence sweep (``members``: globs of member names, a
    text or a list, e.g. ``"copy-*"``; None: every member) at ``steps`` (None: the latest checkpoint;
    else steps of kept checkpoints or snapshots, "last" and "all" among them: analysis_steps); a
    plug-in task whose source file changed since training is refused unless ``allow_changed_task``.

    Writes ``out/analysis.{json,md,png}`` (default ``out = W/analysis``): one object per member
    under ``"members"`` (keyed by member name) at the latest step analysed (``"step"``), and
    under ``"by_step"`` {step: members} every step analysed with these options, in this call or
    an earlier one: a member already there at a step with equal ``options`` is not computed again,
    and the entries of members not analysed now stay as they are (an earlier analysis with other
    options is replaced, or with ``members`` refused: its other entries would mix options).
    ``sequences`` apply to the tasks with ``targets(tokens)``; the members of other tasks are
    analysed on sequences from their task's sampler and named in ``"sequences_note"``. Unless
    ``tensorboard=False``, logs ``analysis/...`` scalars and per-layer attention heatmaps (all
    heads + the combined operator, evaluation sequence 0) to each member's run ``W/tb/<member>``
    at each step computed, so that they draw as curves over steps.
    """
    opened = open_workdir(workdir)
    workdir = opened.files
    experiment = _experiment(opened, allow_changed_task)
    wanted = analysis_steps(opened, steps)
    recorded = opened.recorded_tasks()
    hashes = {name: tasks.source_hashes(recorded.get(name)) for name in sorted({m["task"] for m in experiment.members})}
    options = _options(sequences, num_sequences, seed, allow_changed_task, hashes, kwargs)
    selected = select_members(experiment.members, members)
    selected = [m for m in selected if m.name not in workdir.missing_members()]  # shards still to finish
    out = workdir.analysis_dir if out is None else str(out)
    earlier = _earlier(out, options, workdir, partial=members is not None)
    by_step, source = {k: dict(v) for k, v in earlier.get("by_step", {}).items()}, earlier.get("source")
    batches = {}  # {task_id: (its evaluation Batch, source)}: one per task and parameter values
    for step in wanted:
        todo = [member for member in selected if member.name not in by_step.get(step, {})]
        if not todo:
            if log is not None:
                log(f"step {step}: analysed before with these options, kept")
            continue
        states = workdir.member_states(step)
        absent = [m.name for m in todo if m.name not in states]  # stopped at a halving rung (train/halving.py)
        if absent and log is not None:
            log(f"step {step}: not in its checkpoint (stopped by halving before it): {', '.join(absent)}")
        todo = [member for member in todo if member.name in states]
        by_step.setdefault(step, {})
        for member in todo:
            state = states[member.name]
            task_id = int(experiment.member_constants(member).task_id)
            task = experiment.tasks[task_id]  # the member's task with its parameters bound
            own = sequences is not None and check_task(task).targets is None
            if task_id not in batches:
                m = experiment.config.model
                given = None if own else sequences
                batches[task_id] = task_sequences(task, given, num_sequences, seed, m.seq_len, m.vocab_size)
            batch, task_source = batches[task_id]
            if not own:
                source = task_source
            entry = _member_entry(experiment, member, state, batch, workdir, step, tensorboard, kwargs)
            by_step[step][member.name] = entry
            if log is not None:
                log(f"{member.name} at step {step}: accuracy {entry['accuracy']:.4f}")
    latest = max(by_step)
    order = {member.name: i for i, member in enumerate(experiment.members)}
    by_step = {
        k: dict(sorted(v.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0]))) for k, v in by_step.items()
    }
    members = by_step[latest]
    sampled = {}  # {task name: [member names]}: given sequences, but their task has no targets(tokens)
    for member in experiment.members if sequences is not None else ():
        task = experiment.tasks[int(experiment.member_constants(member).task_id)]
        if member.name in members and check_task(task).targets is None:
            sampled.setdefault(member["task"], []).append(member.name)
    result = {
        "workdir": os.path.abspath(workdir.path),
        "step": int(latest),  # the latest step analysed: "members" are of it
        "source": source if source is not None else {"sequences": "random", "seed": int(seed)},
        "conventions": next(iter(members.values()))["conventions"] if members else None,
        # whether a task source changed since training was allowed; each plug-in task's sha256
        # {"recorded": at training, "current": at this analysis}
        "allow_changed_task": bool(allow_changed_task),
        "task_sha256": {name: h for name, h in hashes.items() if h},
        "members": members,
        "options": options,
        "by_step": {str(k): by_step[k] for k in sorted(by_step)},
    }
    note = sampled_note(sampled, seed)
    if note:
        result["sequences_note"] = note
        if log is not None:
            log(note)
    result["files"] = write_analysis(out, result, plot=plot)
    return result


def select_members(all_members, patterns) -> list:
    """The members whose names match any of ``patterns`` (globs: a text or a list; None: all), in
    sweep order; a glob matching none is a one-line ConfigError naming --members and the members."""
    if patterns is None:
        return list(all_members)
    patterns = [patterns] if isinstance(patterns, (str, os.PathLike)) else list(patterns)
    names = [member.name for member in all_members]
    if not patterns or not all(isinstance(p, str) and p for p in patterns):
        raise ConfigError(f"--members: expected globs of member names, got {patterns!r} (members: {', '.join(names)})")
    for pattern in patterns:
        if not fnmatch.filter(names, pattern):
            raise ConfigError(f"--members: {pattern!r} matches no member (members: {', '.join(names)})")
    return [m for m in all_members if any(fnmatch.fnmatchcase(m.name, p) for p in patterns)]


def sampled_note(sampled: dict, seed) -> str | None:
    """One line naming the members analysed on their task's own sequences although --sequences
    was given (their task defines no targets(tokens)); None when there are none."""
    if not sampled:
        return None
    named = "; ".join(f"task {task}: {', '.join(names)}" for task, names in sorted(sampled.items()))
    return (
        f"--sequences applies to tasks with targets(tokens); these members were analysed on sequences "
        f"drawn by their task's sampler (--seed {seed}): {named}"
    )


def _member_entry(experiment, member, state: dict, batch, workdir, step: int, tensorboard: bool, kwargs) -> dict:
    """One member's analysis at ``step`` (``state``: its raw saved state, a snapshot's holding
    ``params`` only), logged to its TensorBoard run at ``step`` when ``tensorboard``."""
    sizes = model_sizes(state["params"])  # the member's own (architecture axes: experiments/architecture.py)
    task = experiment.tasks[int(experiment.member_constants(member).task_id)]
    res = analyze_params(state["params"], member["heads"], task, batch, sizes, keep_attention=tensorboard, **kwargs)
    attention, combined = res.pop("attention", None), res.pop("combined", None)
    sink_rows = res.pop("rollout_sink_row", None)
    diverged = bool(state["diverged"]) if "diverged" in state else not _finite(state["params"])
    entry = {"name": member.name, **dict(member.hparams), "status": "diverged" if diverged else "ok", **res}
    if tensorboard:
        scalars, images = _tensorboard_entry(entry, attention, combined)
        scalars.update(_head_scalars(entry))
        if sink_rows is not None:
            images[tags.ROLLOUT_SINK_ROW] = sink_row_image(sink_rows)
        log_to_run(workdir.run_dir(member.name), scalars, images, step)
    return entry


def _finite(params) -> bool:
    return all(np.isfinite(np.asarray(x)).all() for x in jax.tree_util.tree_leaves(params))


def analysis_steps(opened: Opened, steps) -> list[int]:
    """The steps to analyse, ascending: None, the latest checkpoint; else a list (or a comma-separated
    text, as --steps takes it) of kept steps (checkpoints and snapshots), "last" (the latest
    checkpoint) and "all" (every snapshot and the latest checkpoint) among them; anything else a one-line ConfigError
    naming --steps and the kept steps."""
    latest = opened.files.latest_step()
    if steps is None:
        return [latest]
    kept = kept_steps(opened)
    items = steps.split(",") if isinstance(steps, str) else [steps] if isinstance(steps, int) else list(steps)
    out = set()
    for item in items:
        word = item.strip() if isinstance(item, str) else item
        if word == "all":  # the snapshots and the latest checkpoint (the rolling one before it by name only)
            out.update([*opened.files.snapshot_steps(), latest])
        elif word == "last":
            out.add(latest)
        else:
            try:
                step = int(word)
            except (TypeError, ValueError):
                step = None
            if step is None or isinstance(word, bool) or step not in kept or str(step) != str(word).strip():
                listed = ", ".join(map(str, kept))
                raise ConfigError(f"--steps: {item!r} is not a kept step, last or all (kept: {listed})")
            out.add(step)
    if not out:
        raise ConfigError(f"--steps: no step given (kept: {', '.join(map(str, kept))}; or last, all)")
    return sorted(out)


def _options(sequences, num_sequences, seed, allow_changed_task, hashes, kwargs) -> dict:
    """What an analysis at a step depends on besides the parameters (analysis.json ``options``)."""
    if sequences is None or isinstance(sequences, (str, os.PathLike)):
        given = None if sequences is None else os.path.abspath(os.fspath(sequences))
    else:  # an array: its bytes
        array = np.ascontiguousarray(np.asarray(sequences))
        given = f"array {array.shape} sha256 {hashlib.sha256(array.tobytes()).hexdigest()}"
    if isinstance(given, str) and os.path.isfile(given):  # a file: its contents too
        with open(given, "rb") as f:
            given = f"{given} sha256 {hashlib.sha256(f.read()).hexdigest()}"
    options = {"sequences": given, "num_sequences": num_sequences, "seed": seed, **kwargs}
    options.update(allow_changed_task=bool(allow_changed_task), task_sha256=hashes)
    return json.loads(json.dumps(json_ready(options)))


def _earlier(out, options: dict, workdir, partial: bool = False) -> dict:
    """The analysis.json already in ``out`` when it is of this workdir with equal ``options``
    ({"by_step": {int step: members}, "source"}), else {}; ``partial`` (some members only): one of
    other options is a ConfigError (merging would mix options)."""
    path = analysis_paths(out)["json"]
    try:
        with open(path) as f:
            earlier = json.load(f)
    except (OSError, ValueError):
        return {}
    if not isinstance(earlier, dict):
        return {}
    if earlier.get("workdir") != os.path.abspath(workdir.path) or not isinstance(earlier.get("by_step"), dict):
        return {}
    if earlier.get("options") != options:
        if partial and isinstance(earlier.get("options"), dict):
            differ = sorted(k for k in {**options, **earlier["options"]} if options.get(k) != earlier["options"].get(k))
            raise ConfigError(
                f"--members: {path} was analysed with other options ({', '.join(differ)}); "
                "use the same options, another --out, or analyse every member"
            )
        return {}
    return {"by_step": {int(k): v for k, v in earlier["by_step"].items()}, "source": earlier.get("source")}


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
    ``analysis/layer{l}/rollout_min``, ``analysis/layer{l}/accuracy_synergy`` and each head's
    ``analysis/layer{l}/head{h}/loss_without`` and ``accuracy_without`` (when ablated)."""
    scalars = {tags.LOSS: entry["loss"], tags.ROLLOUT_MIN: entry["rollout_min"]}
    for layer in entry["layers"]:
        for key in tags.LAYER_HEAD_METRICS:
            if layer.get(key) is not None:
                scalars[tags.layer_tag(layer["layer"], key)] = layer[key]
        for key in tags.HEAD_ABLATION_METRICS:
            for head, value in enumerate((layer.get("ablation") or {}).get(key) or ()):
                scalars[tags.head_tag(layer["layer"], head, key)] = value
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
    markdown = format_analysis(result)
    note = "\n\n".join(n for n in (changed_task_note(result), result.get("sequences_note")) if n)
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
    config = Workdir.of(workdir).config()
    data, tasks = config.get("data", {}), (config.get("sweep") or {}).get("task", ())
    held_out = f"{data['num_eval']} sequences" if "num_eval" in data else "sequences"
    tasks = [tasks] if isinstance(tasks, str) else list(tasks or ())
    if "text" in tasks:  # the corpus's held-out windows, drawn once: every seed is scored on the same ones
        which = f"{held_out} per task (text: the same held-out windows for every seed)"
    else:
        which = f"{held_out} per task and seed"
    return (
        f"train's eval_accuracy ({Workdir.RESULTS}, report) is the same token accuracy on the run's own held-out set, "
        f"{which}: other samples, so the numbers differ a little"
    )
