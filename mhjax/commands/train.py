"""`mhjax train`: validate, describe (--dry-run) or train a sweep in its workdir (mhjax/workflows/train.py)."""

from __future__ import annotations

import sys

import jax

from mhjax.config import ConfigError
from mhjax.experiments import make_experiment
from mhjax.io import compile_cache
from mhjax.io.parts import MISSING
from mhjax.io.results import WriteFailed
from mhjax.io.workdir import Workdir
from mhjax.train.console import next_commands, summary_lines
from mhjax.train.deviceless import CompileFailed
from mhjax.train.interrupt import exits_at_once
from mhjax.train.loop import Interrupted
from mhjax.train.placement import maybe_initialize_distributed
from mhjax.train.preempt import owned_signals
from mhjax.train.status import DivergedError, check_fail
from mhjax.workflows import shards
from mhjax.workflows.configs import load_config
from mhjax.workflows.target import compile_for, report_lines
from mhjax.workflows.train import default_workdir, describe, train


def command(args, overrides) -> int:
    shard = shards.parse(args.shard) if getattr(args, "shard", None) is not None else None
    if shard and (args.distributed or args.coordinator or args.num_processes is not None):
        raise ConfigError("--shard: one independent process per shard; not with --distributed or --coordinator")
    if shard and args.dry_run:  # the shares are planned by the first shard to train, for its machine
        raise ConfigError("--shard: not with --dry-run, which describes the whole sweep (drop --shard)")
    config = load_config(args.config, overrides, validate=False)
    if args.target:
        if not args.dry_run:
            raise ConfigError("--target: only with --dry-run (it compiles for a device that is not here; nothing runs)")
        try:
            report = compile_for(config, args.target, log=lambda m: print(m, file=sys.stderr), describe=print)
        except CompileFailed as exc:  # the target's compiler refused an executable: one line, exit 1
            print(f"mhjax: {exc}", file=sys.stderr)
            return 1
        print("\n".join(report_lines(report)))
        return 0
    if args.coordinator and (args.num_processes is None or args.process_id is None):
        raise ConfigError("--coordinator: needs --num-processes and --process-id")
    if args.num_processes is not None and not (
        args.num_processes >= 1 and 0 <= (args.process_id or 0) < args.num_processes
    ):
        raise ConfigError(
            f"--process-id: must be in [0, {args.num_processes}) with --num-processes {args.num_processes}"
        )
    if not args.dry_run:
        compile_cache.configure()  # before the first compile: a repeated or resumed sweep compiles nothing
        # Before make_experiment: validating a task runs it, which starts the XLA backend, and
        # jax.distributed.initialize must come before that.
        maybe_initialize_distributed(args.coordinator, args.num_processes, args.process_id, args.distributed)
    # A scheduler's signal before training's own handling starts, or after it ends: exit 75 at once
    with exits_at_once(() if args.dry_run else owned_signals()):
        return _sweep(args, config, shard)


def _sweep(args, config, shard) -> int:
    """Describe (--dry-run) or train the sweep of ``config``."""
    experiment = make_experiment(config)  # validates before anything compiles
    if args.dry_run:
        print(describe(experiment, jax.default_backend()))
        return 0
    workdir = Workdir(args.workdir or default_workdir(args.config))
    try:
        log = lambda m: print(m, file=sys.stderr)  # noqa: E731
        changed = dict(allow_changed_task=args.allow_changed_task, interface="cli")
        if shard:
            payload = shards.train_shard(experiment, workdir, *shard, progress=not args.no_progress, log=log, **changed)
        else:
            primary = jax.process_index() == 0
            payload = train(experiment, workdir, progress=not args.no_progress, log=log, primary=primary, **changed)
    except Interrupted as exc:
        print(f"mhjax: {exc}", file=sys.stderr)
        return exc.exit_status
    except WriteFailed as exc:  # a full disk: one line naming the file; the last checkpoint holds
        print(f"mhjax: error: {exc}", file=sys.stderr)
        return 1
    print(f"results: {workdir.results_path} ({len(payload['members'])} members)")
    missing = payload.get(MISSING, [])
    if missing:
        print(f"still missing (their shards have not finished): {', '.join(missing)}")
    table = summary_lines(experiment.summary_table(), payload["members"])
    if table:
        print(f"\nfinal results, mean over seeds (step {payload['steps']}):")
        print("\n".join(f"  {line}" for line in table))
    print("\nnext:")
    commands = next_commands(str(workdir), workdir.tensorboard_dir, experiment.analyzable)
    print("\n".join(f"  {line}" for line in commands))
    try:
        check_fail(payload["members"], args.fail_on_divergence, "--fail-on-divergence")
    except DivergedError as exc:
        print(f"mhjax: {exc}", file=sys.stderr)
        return DivergedError.EXIT_STATUS
    return 0
