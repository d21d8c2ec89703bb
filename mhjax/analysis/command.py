"""The `mhjax analyze` subcommand (wired into mhjax.cli by `register` / `run_analyze`)."""
from __future__ import annotations

import argparse
import os
import sys

from mhjax.config import ConfigError

DESCRIPTION = """\
Mixing time and minimax fidelity of every layer's combined attention operator
(learned head weights; reference conventions: sink included, horizon 100,
mixing capped at 100 steps on the reference chain), and token accuracy, in eval
mode. Either one released PyTorch checkpoint (--torch-checkpoint, --heads,
--task, --out) or every member of a trained sweep (--workdir; also logs scalars
and attention heatmaps to the members' TensorBoard runs). Writes
analysis.json, analysis.md and analysis.png."""


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``analyze`` subparser to an ``add_subparsers()`` object; returns it."""
    p = subparsers.add_parser(
        "analyze", help="DAG metrics (mixing time, minimax fidelity) of trained models",
        description=DESCRIPTION, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    src = p.add_argument_group("what to analyse (exactly one)")
    src.add_argument("--torch-checkpoint", metavar="PATH", default=None,
                     help="a released reference checkpoint {H}_heads_{task}.pt (needs --heads, --task, --out)")
    src.add_argument("--workdir", metavar="W", default=None,
                     help="a trained sweep workdir: analyse every member of its latest checkpoint")
    p.add_argument("--heads", type=int, default=None, help="number of attention heads of --torch-checkpoint")
    p.add_argument("--task", default=None, help="task of --torch-checkpoint: copy, cycle or zero")
    p.add_argument("--out", metavar="DIR", default=None,
                   help="output folder (required with --torch-checkpoint; default W/analysis with --workdir)")
    p.add_argument("--sequences", metavar="FILE.npy", default=None,
                   help="evaluate these (N, T) integer token sequences instead of random ones")
    p.add_argument("--num-sequences", type=int, default=50, help="number of random evaluation sequences")
    p.add_argument("--seed", type=int, default=0, help="seed of the random evaluation sequences")
    p.add_argument("--horizon", type=int, default=100, help="fidelity horizon: max over t = 1..horizon")
    p.add_argument("--max-steps", type=int, default=100, help="cap on the walk length in the mixing time")
    p.add_argument("--chain", choices=("reference", "normalized"), default="reference",
                   help="walk for the mixing time: the reference sampler's chain or column-normalised")
    p.add_argument("--exclude-sink", action="store_true",
                   help="minimax fidelity over non-sink nodes only (the reference includes the sink)")
    p.add_argument("--batch-size", type=int, default=50, help="sequences per forward/metrics call (memory bound)")
    p.add_argument("--no-tensorboard", action="store_true", help="with --workdir: do not log to the TensorBoard runs")
    p.add_argument("--no-plot", action="store_true", help="skip analysis.png")
    return p


def _run(args) -> int:
    from mhjax.analysis import runner

    if (args.torch_checkpoint is None) == (args.workdir is None):
        raise ConfigError("--torch-checkpoint/--workdir: give exactly one of them")
    if args.batch_size is None or args.batch_size < 1:
        raise ConfigError(f"--batch-size: must be a positive integer, got {args.batch_size!r}")
    common = dict(sequences=args.sequences, num_sequences=args.num_sequences, seed=args.seed, plot=not args.no_plot,
                  horizon=args.horizon, max_steps=args.max_steps, chain=args.chain,
                  include_sink=not args.exclude_sink, batch_size=args.batch_size)
    if args.torch_checkpoint is not None:
        if args.heads is None:
            raise ConfigError("--heads: required with --torch-checkpoint")
        if args.task is None:
            raise ConfigError("--task: required with --torch-checkpoint (copy, cycle or zero)")
        if args.out is None:
            raise ConfigError("--out: required with --torch-checkpoint")
        result = runner.analyze_torch_checkpoint(args.torch_checkpoint, args.heads, args.task, args.out, **common)
        entries = [(os.path.basename(args.torch_checkpoint), result)]
    else:
        for option, value in (("--heads", args.heads), ("--task", args.task)):
            if value is not None:
                raise ConfigError(f"{option}: not used with --workdir (each member's own value is used)")
        result = runner.analyze_workdir(args.workdir, args.out, tensorboard=not args.no_tensorboard,
                                        log=lambda m: print(m, file=sys.stderr), **common)
        entries = list(result["members"].items())
    for label, e in entries:
        print(f"{label}: {e['heads']} heads, {e['task']}, accuracy {100 * e['accuracy']:.2f}% "
              f"({e['num_sequences']} sequences of length {e['seq_len']})")
        for layer in e["layers"]:
            print(f"  layer {layer['layer']}: mixing time {layer['mixing_time_mean']:.4f} ± {layer['mixing_time_std']:.4f}"
                  f"  fidelity {layer['fidelity_pct_mean']:.3f}% ± {layer['fidelity_pct_std']:.3f}"
                  f"  best head {layer['best_single_fidelity_pct_mean']:.3f}%"
                  f"  combined > best {100 * layer['combined_beats_best_share']:.0f}%")
    print("wrote " + ", ".join(result["files"].values()))
    return 0


def run_analyze(args) -> int:
    """Run ``mhjax analyze``; bad input prints one line on stderr and returns 2."""
    try:
        return _run(args)
    except ConfigError as exc:
        print(f"mhjax: error: {exc}", file=sys.stderr)
        return 2
