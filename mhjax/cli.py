"""The `mhjax` command line: argparse wiring only (the commands are in mhjax/commands/).

Bad input: one line on stderr, exit status 2, no traceback."""

from __future__ import annotations

import argparse
import os
import sys
import traceback

from mhjax.config import ConfigError, split_overrides, traceback_wanted

ANALYZE_DESCRIPTION = """\
Mixing time and minimax fidelity of every layer's combined attention operator
(learned head weights; reference conventions: sink included, horizon 100,
mixing capped at 100 steps on the reference chain), and token accuracy, in eval
mode. Either one released PyTorch checkpoint (--torch-checkpoint, --heads,
--task, --out) or every member of a trained sweep (--workdir; also logs scalars
and attention heatmaps to the members' TensorBoard runs). Also head ablation
(loss and accuracy with each head removed / kept alone) and attention rollout.
Writes analysis.json, analysis.md and analysis.png."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's usage dump -> our one-line contract (main adds "mhjax: error: ")
        command = self.prog.removeprefix("mhjax").strip()
        raise ConfigError(f"{command}: {message}" if command else message)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows "(required)" on required options and "(default: X)" only where X says something: not
    for None or an off flag, nor where the help text already tells the default."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.required:
            return f"{text} (required)"
        if (
            action.default is None
            or action.default is False
            or action.default == argparse.SUPPRESS
            or "default" in text
        ):
            return text
        return super()._get_help_string(action)


def _parser() -> argparse.ArgumentParser:
    fmt = _HelpFormatter
    parser = _Parser(prog="mhjax", description="Sweeps over the number of attention heads in JAX.", formatter_class=fmt)
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", parser_class=_Parser, title="commands, in the order of use"
    )

    train = sub.add_parser(
        "train",
        help="train a sweep (resumes if the workdir has a checkpoint)",
        formatter_class=fmt,
        description="Train every member of a sweep. Override any config field with --config.FIELD=VALUE.",
    )
    train.add_argument(
        "--config", metavar="FILE", required=True, help="an ml_collections config file, e.g. configs/quick.py"
    )
    train.add_argument(
        "--workdir", metavar="W", default=None, help="output folder (default: runs/<config>-<timestamp>)"
    )
    train.add_argument("--dry-run", action="store_true", help="print members, parameters, FLOPs and memory, then exit")
    train.add_argument(
        "--target",
        metavar="NAME|FILE",
        default=None,
        help="with --dry-run: compile every executable for a device that is not here and print compile "
        "times, memory and kernels. GPUs (need jax[cuda13] at jax's version): h100, h200, a100, NAMExN for N "
        "of them on one host (e.g. h200x8) or a GpuTargetConfig text file; TPU slices (need jax[tpu]): "
        "v5e-4, v5e-8",
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.add_argument(
        "--fail-on-divergence",
        action="store_true",
        help="exit with status 3 when a member diverged (after writing everything)",
    )
    train.add_argument(
        "--allow-changed-task",
        action="store_true",
        help="with a workdir trained before: train on even if a plug-in's source file (a task, a mixture generator, "
        "phi, loss or step rule) changed since; mhjax.json records from which step",
    )
    train.add_argument(
        "--shard",
        metavar="I/N",
        default=None,
        help="train the I-th of N shares of the sweep (I in [0, N), e.g. $SLURM_ARRAY_TASK_ID) as an independent "
        "job in the shared workdir; results.json gathers every shard's members (docs/shards.md)",
    )
    dist = train.add_argument_group("several hosts (jax.distributed; one process per host)")
    dist.add_argument(
        "--distributed",
        action="store_true",
        help="call jax.distributed.initialize() with auto-detection (SLURM, TPU pods)",
    )
    dist.add_argument("--coordinator", default=None, help="coordinator address host:port (explicit initialisation)")
    dist.add_argument("--num-processes", type=int, default=None, help="number of processes (with --coordinator)")
    dist.add_argument("--process-id", type=int, default=None, help="this process's id (with --coordinator)")

    status = sub.add_parser(
        "status",
        help="where a sweep is: each member's step, state, checkpoint age, rate and time to finish",
        formatter_class=fmt,
        description="Each member's step reached, state (training, done, diverged, stopped, missing), the age of "
        "its latest checkpoint, member-steps/s and time to finish; reads only, so it works while `mhjax train` "
        "holds the workdir (whose pid it names).",
    )
    status.add_argument("--workdir", metavar="W", required=True, help="a sweep workdir, training or not")
    status.add_argument("--json", action="store_true", help="print the status as JSON")

    register_analyze(sub)
    register_sample(sub)

    report = sub.add_parser(
        "report",
        help="write W/report.md: results tables and figures (reads well on GitHub)",
        formatter_class=fmt,
        description="Summarise a trained sweep in W/report.md with figures in "
        "W/report/: results per head count, training curves and, after `mhjax analyze --workdir W`, "
        "mixing time, minimax fidelity and synergy per layer and head count.",
    )
    report.add_argument("--workdir", metavar="W", required=True, help="a trained sweep workdir")
    report.add_argument(
        "--reference",
        metavar="DIR",
        default=None,
        help="also compare with the released checkpoints {H}_heads_{task}.pt in DIR and check the paper's claims",
    )
    report.add_argument(
        "--importance-member",
        metavar="NAME",
        default=None,
        help="the member whose per-head importance along training is drawn (after `mhjax analyze --steps`; "
        "default: the first with the most heads)",
    )

    sub.add_parser(
        "configs",
        help="list the bundled configs, a line each: what it trains, for which paper",
        formatter_class=fmt,
        description="List the bundled configs (configs/*.py), a line each: what the config trains, for which paper.",
    )

    ex2 = sub.add_parser(
        "example2",
        help="the paper's Example 2: two heads whose combination beats both (fidelities, a figure)",
        formatter_class=fmt,
        description="Example 2 / Figure 3 of 'Beyond Parallelism' (arXiv 2507.02944): on a 4-node DAG, the minimax "
        "fidelity of each of two heads and of their combination (the paper's 37.5%, 25.0% and 41.7%). "
        "Writes DIR/example2.json and DIR/example2.png.",
    )
    ex2.add_argument("--out", metavar="DIR", default="example2", help="output folder")
    return parser


def register_analyze(subparsers) -> argparse.ArgumentParser:
    """Add the ``analyze`` subparser to an ``add_subparsers()`` object; returns it."""
    p = subparsers.add_parser(
        "analyze",
        help="DAG metrics (mixing time, minimax fidelity) and accuracy of trained models",
        description=ANALYZE_DESCRIPTION,
        formatter_class=_HelpFormatter,
    )
    src = p.add_argument_group("what to analyse (exactly one)")
    src.add_argument(
        "--torch-checkpoint",
        metavar="PATH",
        default=None,
        help="a released reference checkpoint {H}_heads_{task}.pt (needs --heads, --task, --out)",
    )
    src.add_argument(
        "--workdir",
        metavar="W",
        default=None,
        help="a trained sweep workdir: analyse every member of its latest checkpoint",
    )
    p.add_argument(
        "--steps",
        metavar="S,S,...",
        default=None,
        help="with --workdir: the steps to analyse, kept checkpoints or snapshots (config.train.snapshot_steps), "
        "e.g. 100,1000,last or all (the snapshots and the latest checkpoint; default: the latest checkpoint); "
        "a step analysed before with the same "
        "options is kept, not computed again",
    )
    p.add_argument(
        "--members",
        metavar="GLOB",
        action="append",
        default=None,
        help="with --workdir: analyse only the members whose names match (e.g. 'copy-*'; repeatable) and merge "
        "them into analysis.json, the other members' entries kept",
    )
    p.add_argument("--heads", type=int, default=None, help="number of attention heads of --torch-checkpoint")
    p.add_argument(
        "--task", default=None, help="task of --torch-checkpoint: a registered task (copy, cycle, zero, ...)"
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        default=None,
        help="output folder (required with --torch-checkpoint; default W/analysis with --workdir)",
    )
    p.add_argument(
        "--sequences",
        metavar="FILE.npy",
        default=None,
        help="evaluate these (N, T) integer token sequences instead of random ones (tasks with targets(tokens); "
        "the others' members are named and analysed on their own sampled sequences)",
    )
    p.add_argument("--num-sequences", type=int, default=50, help="number of random evaluation sequences")
    p.add_argument("--seed", type=int, default=0, help="seed of the random evaluation sequences")
    p.add_argument("--horizon", type=int, default=100, help="fidelity horizon: max over t = 1..horizon")
    p.add_argument("--max-steps", type=int, default=100, help="cap on the walk length in the mixing time")
    p.add_argument(
        "--chain",
        choices=("reference", "normalized"),
        default="reference",
        help="walk for the mixing time: the reference sampler's chain or column-normalised",
    )
    p.add_argument(
        "--exclude-sink",
        action="store_true",
        help="minimax fidelity over non-sink nodes only (the reference includes the sink)",
    )
    p.add_argument("--batch-size", type=int, default=50, help="sequences per forward/metrics call (memory bound)")
    p.add_argument("--no-tensorboard", action="store_true", help="with --workdir: do not log to the TensorBoard runs")
    p.add_argument("--no-plot", action="store_true", help="skip analysis.png")
    p.add_argument(
        "--allow-changed-task",
        action="store_true",
        help="with --workdir: analyse even if a plug-in task's source file changed since training",
    )
    p.add_argument(
        "--no-ablation",
        action="store_true",
        help="skip head ablation (loss and accuracy with each head removed / kept alone)",
    )
    return p


def register_sample(subparsers) -> argparse.ArgumentParser:
    """Add the ``sample`` subparser (mhjax/commands/sample.py) to an ``add_subparsers()`` object."""
    p = subparsers.add_parser(
        "sample",
        help="continue a prompt with a trained member (text: bytes in, text out)",
        formatter_class=_HelpFormatter,
        description="Continue --prompt by --tokens tokens sampled from member --member of a trained sequence "
        "sweep. The model has learned positions and a context of model.seq_len tokens: each token is predicted "
        "from the last seq_len tokens by a full forward pass, as nanoGPT's generate does (no key/value cache, "
        "none needed: one compiled step for any prompt and length). A byte file's members read the prompt as "
        "UTF-8 text and print text; other members (a .bin corpus, a synthetic task) read and print token ids, "
        "or text through --vocab. Prints the prompt and its continuation.",
    )
    p.add_argument("--workdir", metavar="W", required=True, help="a trained sequence sweep workdir")
    p.add_argument("--member", metavar="M", required=True, help="a member's name, e.g. text-h4-s0")
    p.add_argument(
        "--step", type=int, default=None, help="a kept checkpoint or snapshot step (default: the latest checkpoint)"
    )
    p.add_argument(
        "--prompt",
        metavar="TEXT",
        required=True,
        help="text (a byte file's members), else token ids '12 7 301' or words of the vocabulary file",
    )
    p.add_argument("--tokens", metavar="N", type=int, default=200, help="how many tokens to sample")
    p.add_argument("--temperature", metavar="T", type=float, default=1.0, help="0: greedy (the most likely token)")
    p.add_argument(
        "--top-k", metavar="K", type=int, default=None, help="sample among the K most likely tokens (default: all)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the draws (token i: fold_in(PRNGKey(seed), i))")
    p.add_argument(
        "--vocab",
        metavar="FILE",
        default=None,
        help="a vocabulary for token ids: one token per line, line number = id (a .bin corpus's members)",
    )
    p.add_argument(
        "--join", metavar="TEXT", default=None, help="with --vocab: what goes between tokens (default: a space)"
    )
    return p


COMMANDS = ("train", "status", "analyze", "sample", "report", "configs", "example2")  # the order of use, as in --help


def _command(name: str):
    """The command's implementation, imported when it runs (importing jax takes seconds: `--help`
    and argument errors stay fast)."""
    import importlib

    return importlib.import_module(f"mhjax.commands.{name}").command


def quiet_backends(args) -> None:
    """Before any JAX backend starts: a dry run for a target compiles for it from the CPU
    (JAX_PLATFORMS=cpu: JAX starts no GPU backend; the GPU plugin still registers its compiler),
    and JAX's plugin errors go to mhjax.log, not the console (io/plugin_log.py)."""
    from mhjax.io import plugin_log

    if getattr(args, "target", None):
        os.environ["JAX_PLATFORMS"] = "cpu"
        if "jax" in sys.modules:
            sys.modules["jax"].config.update("jax_platforms", "cpu")
    plugin_log.hold()


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
        quiet_backends(args)
        status = _command(args.command)(args, overrides)
        sys.stdout.flush()  # here, so that a reader that left (`mhjax configs | head`) is caught below
        return status
    except BrokenPipeError:  # the reader of stdout left: stop quietly, as the Python docs advise
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except ConfigError as exc:
        if exc.__cause__ is not None and traceback_wanted():  # MHJAX_TRACEBACK=1: where in user code
            traceback.print_exception(exc.__cause__)
        print(f"mhjax: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("mhjax: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
