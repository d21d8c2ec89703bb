"""`mhjax analyze`: DAG metrics of a released checkpoint or of every member of a trained sweep.

The metrics themselves are in :mod:`mhjax.analysis.metrics`; this module finds the models
(the safe torch reader, a workdir's latest checkpoint), writes analysis.json/.md/.png and logs
to the members' TensorBoard runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import ml_collections

from mhjax.analysis.metrics import analyze_checkpoint, analyze_params, one_line, tokens_for
from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.io import compile_cache
from mhjax.io.checkpoint import METADATA, SweepCheckpointer
from mhjax.io.lock import WorkdirLock
from mhjax.io.results import read_workdir_json, write_json
from mhjax.io.tensorboard import log_to_run
from mhjax.models.probe import config_sizes
from mhjax.plotting.analysis import format_analysis, plot_analysis
from mhjax.plotting.images import attention_grid
from mhjax.train.engine import unstack
from mhjax.train.loop import Sweep


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


def _workdir_sweep(workdir: str):
    """(experiment, Sweep, latest step, states) restored from a trained sweep workdir."""
    meta = read_workdir_json(workdir, METADATA, "not a mhjax sweep workdir")
    try:
        config = ml_collections.ConfigDict(meta["config"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"--workdir: {os.path.join(workdir, METADATA)} is unreadable ({type(exc).__name__})"
        ) from None
    experiment = make_experiment(config)
    if not experiment.analyzable:
        raise ConfigError(
            f"--workdir: analyze needs a sequence (copy/cycle/zero) sweep; {workdir} holds a {experiment.kind!r} sweep"
        )
    if not os.path.isdir(os.path.join(workdir, "checkpoints")):
        raise ConfigError(f"--workdir: {workdir} has no checkpoints/; train it first")
    checkpointer = SweepCheckpointer(workdir)
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
    **kwargs,
) -> dict:
    """Analyse every member of a trained sequence sweep (latest checkpoint).

    Writes ``out/analysis.{json,md,png}`` (default ``out = W/analysis``) with one
    object per member under ``"members"`` (keyed by member name), and, unless
    ``tensorboard=False``, logs ``analysis/...`` scalars and per-layer attention
    heatmaps (all heads + the combined operator, evaluation sequence 0) to each
    member's run ``W/tb/<member>`` at the checkpoint's step.
    """
    workdir = str(workdir)
    experiment, sweep, step, states = _workdir_sweep(workdir)
    m = experiment.config.model
    tokens, source = tokens_for(sequences, num_sequences, seed, m.seq_len, m.vocab_size)
    sizes = config_sizes(m)
    member_states = sweep.member_states(states)
    members = {}
    for member in experiment.members:
        state = member_states[member.name]
        res = analyze_params(
            state.params, member["heads"], member["task"], tokens, sizes, keep_attention=tensorboard, **kwargs
        )
        attention, combined = res.pop("attention", None), res.pop("combined", None)
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
            log_to_run(workdir, member.name, *_tensorboard_entry(entry, attention, combined), step)
    result = {
        "workdir": os.path.abspath(workdir),
        "step": int(step),
        "source": source,
        "conventions": next(iter(members.values()))["conventions"] if members else None,
        "members": members,
    }
    out = os.path.join(workdir, "analysis") if out is None else str(out)
    result["files"] = write_analysis(out, result, plot=plot)
    return result


def _tensorboard_entry(entry: dict, attention, combined) -> tuple[dict, dict]:
    """(scalars ``analysis/accuracy``, ``analysis/layer{l}/...``; heatmaps ``analysis/attention/layer{l}``)."""
    scalars = {
        "analysis/accuracy": entry["accuracy"],
        "analysis/accuracy_excluding_first": entry["accuracy_excluding_first"],
    }
    images = {}
    for layer in entry["layers"]:
        l = layer["layer"]
        for key, tag in (
            ("mixing_time_mean", "mixing_time"),
            ("mixing_time_std", "mixing_time_std"),
            ("fidelity_pct_mean", "fidelity_pct"),
            ("fidelity_pct_std", "fidelity_pct_std"),
            ("best_single_fidelity_pct_mean", "best_single_fidelity_pct"),
            ("combined_beats_best_share", "combined_beats_best_share"),
        ):
            scalars[f"analysis/layer{l}/{tag}"] = layer[key]
        if attention is not None:
            images[f"analysis/attention/layer{l}"] = attention_grid(
                attention[l], None if combined is None else combined[l]
            )
    return scalars, images


def write_analysis(out, result: dict, plot: bool = True) -> dict[str, str]:
    """Write ``analysis.json``, ``analysis.md`` and (``plot``) ``analysis.png`` under ``out``."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out: cannot create {out} ({type(exc).__name__}: {one_line(exc)})") from None
    files = {"json": str(out / "analysis.json"), "md": str(out / "analysis.md")}
    if plot:
        files["png"] = str(out / "analysis.png")
    write_json(files["json"], {**{k: v for k, v in result.items() if k != "files"}, "files": files})
    (out / "analysis.md").write_text(format_analysis(result))
    if plot:
        plot_analysis(result, files["png"])
    return files


def _run(args) -> int:
    if (args.torch_checkpoint is None) == (args.workdir is None):
        raise ConfigError("--torch-checkpoint/--workdir: give exactly one of them")
    if args.batch_size is None or args.batch_size < 1:
        raise ConfigError(f"--batch-size: must be a positive integer, got {args.batch_size!r}")
    common = dict(
        sequences=args.sequences,
        num_sequences=args.num_sequences,
        seed=args.seed,
        plot=not args.no_plot,
        horizon=args.horizon,
        max_steps=args.max_steps,
        chain=args.chain,
        include_sink=not args.exclude_sink,
        batch_size=args.batch_size,
    )
    if args.torch_checkpoint is not None:
        if args.heads is None:
            raise ConfigError("--heads: required with --torch-checkpoint")
        if args.task is None:
            raise ConfigError("--task: required with --torch-checkpoint (copy, cycle or zero)")
        if args.out is None:
            raise ConfigError("--out: required with --torch-checkpoint")
        result = analyze_torch_checkpoint(args.torch_checkpoint, args.heads, args.task, args.out, **common)
        entries = [(os.path.basename(args.torch_checkpoint), result)]
    else:
        for option, value in (("--heads", args.heads), ("--task", args.task)):
            if value is not None:
                raise ConfigError(f"{option}: not used with --workdir (each member's own value is used)")
        with WorkdirLock(args.workdir, "analyze"):
            result = analyze_workdir(
                args.workdir,
                args.out,
                tensorboard=not args.no_tensorboard,
                log=lambda m: print(m, file=sys.stderr),
                **common,
            )
        entries = list(result["members"].items())
    for label, e in entries:
        print(
            f"{label}: {e['heads']} heads, {e['task']}, accuracy {100 * e['accuracy']:.2f}% "
            f"({e['num_sequences']} sequences of length {e['seq_len']})"
        )
        for layer in e["layers"]:
            print(
                f"  layer {layer['layer']}: "
                f"mixing time {layer['mixing_time_mean']:.4f} ± {layer['mixing_time_std']:.4f}"
                f"  fidelity {layer['fidelity_pct_mean']:.3f}% ± {layer['fidelity_pct_std']:.3f}"
                f"  best head {layer['best_single_fidelity_pct_mean']:.3f}%"
                f"  combined > best {100 * layer['combined_beats_best_share']:.0f}%"
            )
    print("wrote " + ", ".join(result["files"].values()))
    return 0


def run_analyze(args) -> int:
    """Run ``mhjax analyze``; bad input prints one line on stderr and returns 2."""
    try:
        return _run(args)
    except ConfigError as exc:
        print(f"mhjax: error: {exc}", file=sys.stderr)
        return 2


def command(args, overrides) -> int:
    compile_cache.configure()  # a repeated analysis loads its compiled programs from disk
    return run_analyze(args)
