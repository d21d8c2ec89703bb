"""The `mhjax` command line. Bad input: one line on stderr, exit status 2, no traceback."""
from __future__ import annotations

import argparse
import glob
import os
import sys
import time

from mhjax.config import ConfigError, apply_overrides, load_config_file, split_overrides

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's usage dump -> our one-line contract
        raise ConfigError(f"{self.prog}: {message}")


def _parser() -> argparse.ArgumentParser:
    fmt = argparse.ArgumentDefaultsHelpFormatter
    parser = _Parser(prog="mhjax", description="Sweeps over the number of attention heads in JAX.", formatter_class=fmt)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    train = sub.add_parser("train", help="train a sweep (resumes if the workdir has a checkpoint)", formatter_class=fmt,
                           description="Train every member of a sweep. Override any config field with --config.FIELD=VALUE.")
    train.add_argument("--config", required=True, help="an ml_collections config file, e.g. configs/quick.py")
    train.add_argument("--workdir", default=None, help="output folder (default: runs/<config>-<timestamp>)")
    train.add_argument("--dry-run", action="store_true", help="print members, parameters, FLOPs and memory, then exit")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    dist = train.add_argument_group("several hosts (jax.distributed; one process per host)")
    dist.add_argument("--distributed", action="store_true", help="call jax.distributed.initialize() with auto-detection (SLURM, TPU pods)")
    dist.add_argument("--coordinator", default=None, help="coordinator address host:port (explicit initialisation)")
    dist.add_argument("--num-processes", type=int, default=None, help="number of processes (with --coordinator)")
    dist.add_argument("--process-id", type=int, default=None, help="this process's id (with --coordinator)")

    ex2 = sub.add_parser("example2", help="the paper's Example 2 (three minimax fidelities and a figure)", formatter_class=fmt)
    ex2.add_argument("--out", default="example2", help="output folder")

    sub.add_parser("configs", help="list the bundled configs", formatter_class=fmt)

    from mhjax.analysis.command import register as register_analyze

    register_analyze(sub)

    report = sub.add_parser("report", help="write W/report.md: results tables and figures (reads well on GitHub)",
                            formatter_class=fmt, description="Summarise a trained sweep in W/report.md with figures in "
                            "W/report/: results per head count, training curves and, after `mhjax analyze --workdir W`, "
                            "mixing time, minimax fidelity and synergy per layer and head count.")
    report.add_argument("--workdir", metavar="W", required=True, help="a trained sweep workdir")
    report.add_argument("--reference", metavar="DIR", default=None, help="also compare with the released checkpoints "
                        "{H}_heads_{task}.pt in DIR and check the paper's claims (mhjax.reproduction)")
    return parser


def _load_config(path: str, overrides: dict):
    config = load_config_file(path)
    return apply_overrides(config, overrides) if overrides else config


def cmd_train(args, overrides) -> int:
    config = _load_config(args.config, overrides)
    from mhjax.experiments import make_experiment

    experiment = make_experiment(config)  # validates before anything compiles
    if args.coordinator and (args.num_processes is None or args.process_id is None):
        raise ConfigError("--coordinator: needs --num-processes and --process-id")
    if args.num_processes is not None and not (args.num_processes >= 1 and 0 <= (args.process_id or 0) < args.num_processes):
        raise ConfigError(f"--process-id: must be in [0, {args.num_processes}) with --num-processes {args.num_processes}")
    if args.dry_run:
        from mhjax.train.dryrun import describe

        print(describe(experiment))
        return 0
    workdir = args.workdir or os.path.join(
        "runs", f"{os.path.splitext(os.path.basename(args.config))[0]}-{time.strftime('%Y%m%d-%H%M%S')}"
    )
    from mhjax.train.loop import Interrupted, run
    from mhjax.train.placement import maybe_initialize_distributed

    maybe_initialize_distributed(args.coordinator, args.num_processes, args.process_id, args.distributed)

    try:
        payload = run(experiment, workdir, progress=not args.no_progress, log=lambda m: print(m, file=sys.stderr))
    except Interrupted as exc:
        print(f"mhjax: {exc}", file=sys.stderr)
        return 130
    print(f"results: {os.path.join(workdir, 'results.json')} ({len(payload['members'])} members)")
    return 0


def cmd_example2(args, overrides) -> int:
    from mhjax.analysis.example2 import format_example2, run_example2

    print(format_example2(run_example2(args.out)))
    return 0


def cmd_configs(args, overrides) -> int:
    for path in sorted(glob.glob(os.path.join(CONFIG_DIR, "*.py"))):
        config_doc = ""
        with open(path) as f:
            source = f.read()
        if source.lstrip().startswith('"""'):
            config_doc = source.lstrip()[3:].split('"""', 1)[0].strip().splitlines()[0]
        print(f"{os.path.relpath(path):<28} {config_doc}")
    return 0


def cmd_analyze(args, overrides) -> int:
    from mhjax.analysis.command import run_analyze

    return run_analyze(args)


def cmd_report(args, overrides) -> int:
    from mhjax.report import write_report

    result = write_report(args.workdir, reference=args.reference)
    print(f"wrote {result['md']} ({len(result['figures'])} figures)")
    if result["needs_analysis"]:
        print(f"no analysis yet: `mhjax analyze --workdir {args.workdir}` adds mixing time, fidelity and synergy", file=sys.stderr)
    return 0


COMMANDS = {"train": cmd_train, "example2": cmd_example2, "configs": cmd_configs, "analyze": cmd_analyze, "report": cmd_report}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        argv, overrides = split_overrides(argv)
        args = _parser().parse_args(argv)
        if args.command is None:
            _parser().print_help()
            return 2
        if overrides and args.command != "train":
            raise ConfigError(f"--config.{next(iter(overrides))}: config overrides apply only to 'mhjax train'")
        return COMMANDS[args.command](args, overrides)
    except ConfigError as exc:
        print(f"mhjax: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mhjax: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
