"""`mhjax analyze`: DAG metrics of a released checkpoint or of every member of a trained sweep
(mhjax/workflows/analyze.py); this module checks the options and prints the summary."""

from __future__ import annotations

import fnmatch
import os
import sys

from mhjax.config import ConfigError
from mhjax.data import tasks
from mhjax.io import compile_cache
from mhjax.io.lock import WorkdirLock
from mhjax.io.workdir import Workdir
from mhjax.plotting.style import heads_label
from mhjax.workflows.analyze import analyze_torch_checkpoint, analyze_workdir, held_out_note, sequences_text
from mhjax.workflows.shards import missing_line


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
        ablate=not args.no_ablation,
    )
    if args.torch_checkpoint is not None:
        if args.heads is None:
            raise ConfigError("--heads: required with --torch-checkpoint")
        if args.task is None:
            raise ConfigError("--task: required with --torch-checkpoint (e.g. copy, cycle or zero)")
        if args.out is None:
            raise ConfigError("--out: required with --torch-checkpoint")
        if args.steps is not None:
            raise ConfigError("--steps: only with --workdir (a released checkpoint has one step)")
        if args.members is not None:
            raise ConfigError("--members: only with --workdir (a released checkpoint is one model)")
        result = analyze_torch_checkpoint(args.torch_checkpoint, args.heads, args.task, args.out, **common)
        entries = [(os.path.basename(args.torch_checkpoint), result)]
    else:
        for option, value in (("--heads", args.heads), ("--task", args.task)):
            if value is not None:
                raise ConfigError(f"{option}: not used with --workdir (each member's own value is used)")
        workdir = Workdir(args.workdir)
        with WorkdirLock(workdir, "analyze"):
            result = analyze_workdir(
                workdir,
                args.out,
                tensorboard=not args.no_tensorboard,
                allow_changed_task=args.allow_changed_task,
                steps=args.steps,
                members=args.members,
                **common,
            )
        entries = [(name, e) for name, e in result["members"].items() if _matches(name, args.members)]
        if result.get("sequences_note"):
            print(result["sequences_note"])
    if entries:
        e = entries[0][1]
        # copy, cycle and zero read targets from random tokens; other tasks' samplers draw whole sequences
        drawn = any(tasks.get_task(e["task"]).targets is None for _, e in entries)
        text = sequences_text(result["source"], e["num_sequences"], e["seq_len"], drawn)
        print(f"token accuracy in eval mode on {text}")
    for label, e in entries:
        diverged = " (diverged)" if e.get("status", "ok") != "ok" else ""
        print(f"{label}: {heads_label(e['heads'])}, {e['task']}, accuracy {100 * e['accuracy']:.2f}%{diverged}")
        for layer in e["layers"]:
            print(
                f"  layer {layer['layer']}: "
                f"mixing time {layer['mixing_time_mean']:.4f} ± {layer['mixing_time_std']:.4f}"
                f"  fidelity {layer['fidelity_pct_mean']:.3f}% ± {layer['fidelity_pct_std']:.3f}"
                f"  best head {layer['best_single_fidelity_pct_mean']:.3f}%"
                f"  combined > best {100 * layer['combined_beats_best_share']:.0f}%"
            )
    if args.workdir is not None:
        if len(result["by_step"]) > 1:
            print(f"steps analysed: {', '.join(result['by_step'])} (by_step); above: step {result['step']}")
        print(held_out_note(workdir))
        missing = missing_line(workdir)
        if missing:
            print(missing, file=sys.stderr)
    print("wrote " + ", ".join(result["files"].values()))
    return 0


def _matches(name: str, patterns) -> bool:
    return patterns is None or any(fnmatch.fnmatchcase(name, p) for p in patterns)


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
