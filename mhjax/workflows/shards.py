"""A sweep trained as N independent jobs: ``mhjax train ... --shard I/N`` trains the I-th of N
shares of the sweep's members (I counts from 0, as ``$SLURM_ARRAY_TASK_ID`` and
``$JOB_COMPLETION_INDEX`` do), with no jax.distributed and nothing shared at run time.

The first shard to start plans the shares and records them in mhjax.json's ``sweep_history``
(one part per shard, io/parts.py, marked ``"shard": "I/N"``); every later shard, and every
rerun, trains the recorded share, so the split never depends on which shard came first or on
the machine it runs on. Shares are whole programs, balanced by the experiment's cost model
(mhjax.plan's ``Plan.step_seconds``, longest first onto the least loaded shard): a member trains beside
the same program mates as in the one-job run, and its numbers are the one-job run's. Only with
more shards than programs is a program split (the costliest one, in halves); its members are
then computed in a smaller batch: float rounding at step 0 that training amplifies (docs/shards.md
has the measured sizes), which the shard says when it starts.

Each shard holds its own lock (W/shards/<I>/.mhjax.lock) while it trains, checkpoints in
W/shards/<I>/, writes its members' TensorBoard runs and traces, and merges its members into
results.json under the workdir's short write lock (io/shared_write.py); results.json names the
members still missing until every shard has written."""

from __future__ import annotations

import contextlib
import json
import os
import re

import jax

from mhjax.config import ConfigError
from mhjax.io import parts
from mhjax.io.lock import WorkdirLock
from mhjax.io.metadata import HISTORY
from mhjax.io.results import json_ready
from mhjax.io.shared_write import SharedWrite
from mhjax.io.workdir import Workdir
from mhjax.train import halving
from mhjax.train.loop import run
from mhjax.workflows import growth
from mhjax.workflows.growth import Part
from mhjax.workflows.train import check_sources, library_logs

_SHARD = re.compile(r"^\s*([+-]?\d+)\s*/\s*([+-]?\d+)\s*$")


def parse(text: str) -> tuple[int, int]:
    """``I/N`` as (I, N); anything else a one-line ConfigError naming the allowed values."""
    match = _SHARD.match(str(text))
    if not match:
        raise ConfigError(f"--shard: I/N, shard I of N with N >= 1 and I in [0, N), e.g. --shard 0/4 (got {text!r})")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1:
        raise ConfigError(f"--shard: N must be >= 1 in I/N (got {text})")
    if not 0 <= index < count:
        raise ConfigError(f"--shard: I must be in [0, {count}) in I/{count}, counting from 0 (got {text})")
    return index, count


def plan(experiment, count: int, backend: str) -> list[dict]:
    """The sweep's ``count`` shares: per shard {"members": names in sweep order, "split": the
    programs it shares with another shard}. Whole programs, longest first onto the least loaded
    shard; with fewer programs than shards, the costliest program of more than one member is
    halved until there are enough pieces. "programs": {member: its program in the one-job run}.
    More shards than members: a ConfigError."""
    members = experiment.members
    if halving.spec_of(experiment.config):  # a rung ranks a whole comparison group, which a share may split
        raise ConfigError("--shard: not with config.train.halving (train the halved sweep as one job)")
    if count > len(members):
        raise ConfigError(
            f"--shard: N must be in [1, {len(members)}]: the sweep has {len(members)} members (got N = {count})"
        )
    plan = experiment.plan(backend)
    pieces = [(p.name, list(p.members), plan.step_seconds(p)) for p in plan.programs]
    while len(pieces) < count:
        k = max(range(len(pieces)), key=lambda j: (len(pieces[j][1]) > 1, pieces[j][2], -j))
        name, idx, cost = pieces[k]
        half = (len(idx) + 1) // 2
        pieces[k : k + 1] = [
            (name, idx[:half], cost * half / len(idx)),
            (name, idx[half:], cost * (1 - half / len(idx))),
        ]
    loads, shares = [0.0] * count, [[] for _ in range(count)]
    for j in sorted(range(len(pieces)), key=lambda j: (-pieces[j][2], j)):
        shard = min(range(count), key=lambda s: (loads[s], s))
        loads[shard] += pieces[j][2]
        shares[shard].append(pieces[j])
    names = [p for p, *_ in pieces]
    split = {p for p in names if names.count(p) > 1}
    return [
        {
            "members": [members[i].name for i in sorted(i for _, idx, _ in share for i in idx)],
            "split": sorted({p for p, *_ in share} & split),
            "programs": {members[i].name: p for p, idx, _ in share for i in idx},
        }
        for share in shares
    ]


def prepare(experiment, workdir: Workdir, index: int, count: int, backend: str) -> list[tuple[int, Part, dict]]:
    """The recorded shards shard ``index`` of ``count`` trains in ``workdir`` (its own; of a
    workdir started as a multiple of ``count`` shards, several: ``recorded_shards``), each as
    (its index, its part of the sweep, its history entry): planned and recorded in mhjax.json by
    the first shard, read by the others. Under the short write lock; a shard of an N that does not
    divide the workdir's, another config, or a workdir trained as one job is refused in one line
    before anything is written."""
    # checked before the lock too, whose file a refusal would leave behind
    recorded_count = _check_count(workdir, index, count)
    if recorded_count is not None and growth.grows(experiment, workdir):
        raise ConfigError(
            f"--shard: {workdir.path} was started as {recorded_count} shards, which do not grow (added sweep values): "
            "the shares are planned once, when the first shard starts, and each shard trains its recorded share; "
            "train the added values in a new workdir"
        )
    shares = plan(experiment, count, backend) if recorded_count is None else None
    with SharedWrite(workdir.path):
        count_then = _check_count(workdir, index, count)  # again: another shard may have just planned
        recorded = (experiment.config.to_dict(), experiment.kind, experiment.metadata(), experiment.cannot_extend)
        if count_then is None:
            shares = shares or plan(experiment, count, backend)
            workdir.check_or_write_metadata(*recorded)
            sweep = json.loads(json.dumps(experiment.config.to_dict()))["sweep"]
            fields = {m.name: json_ready(m.hparams) for m in experiment.members}
            history = [
                {
                    "folder": parts.shard_folder(i),
                    "shard": f"{i}/{count}",
                    "sweep": sweep,
                    "members": {n: fields[n] for n in share["members"]},
                    "split_programs": share["split"],
                    "programs": share["programs"],  # the one-job run's program of each member
                }
                for i, share in enumerate(shares)
            ]
            workdir.write_metadata({**workdir.metadata(), HISTORY: history})
        else:
            workdir.check_or_write_metadata(*recorded)  # another config: refused; a larger train.steps: longer
        history = workdir.metadata()[HISTORY]
    order, out = [m.name for m in experiment.members], []
    for j in recorded_shards(index, count, count_then or count):
        names = list(history[j]["members"])
        unknown = [n for n in names if n not in order]
        if unknown:  # a history edited by hand: never train around it
            raise ConfigError(
                f"--shard: {workdir.metadata_path} records members the config lacks: {', '.join(unknown)}"
            )
        view = workdir.part(history[j]["folder"], order)
        view.program_names = history[j].get("programs")
        out.append((j, Part(view, experiment.subset(names)), history[j]))
    return out


def recorded_shards(index: int, count: int, recorded: int) -> list[int]:
    """The recorded shards that shard ``index`` of ``count`` trains in a workdir started as
    ``recorded`` shards (``count`` divides it): index, index + count, ... one after the other, each
    from its own checkpoints, so 4 shards resumed as 2 train 0, 2 and 1, 3 whatever step each stopped at."""
    return list(range(index, recorded, count))


def _check_count(workdir: Workdir, index: int, count: int) -> int | None:
    """The workdir's shard count (None: a new workdir); another N or a one-job sweep: ConfigError."""
    count_then = workdir.shard_count()
    if count_then is None and os.path.isfile(workdir.metadata_path):
        raise ConfigError(
            f"--shard: {workdir.path} holds a sweep trained as one job, not in shards; train it without --shard "
            "or shard a new workdir"
        )
    if count_then is not None and count_then % count:
        divisors = ", ".join(str(m) for m in range(count_then, 0, -1) if count_then % m == 0)
        raise ConfigError(
            f"--shard: {workdir.path} was started as {count_then} shards: use I/M with M one of {divisors} (M "
            f"below {count_then} trains whole shards, one after the other) and I in [0, M) (got {index}/{count})"
        )
    return count_then


def train_shard(
    experiment,
    workdir,
    index: int,
    count: int,
    *,
    progress: bool = True,
    log=print,
    allow_changed_task: bool = False,
    interface: str = "python",
) -> dict:
    """Train (or resume) shard ``index`` of ``count`` of ``experiment``'s sweep in ``workdir``;
    returns results.json's payload (every shard's members written so far). A plug-in whose source
    changed since the workdir's run is refused as by ``train`` (workflows/train.check_sources)."""
    if jax.process_count() > 1:
        raise ConfigError("--shard: one independent process per shard; not with --distributed or --coordinator")
    workdir = Workdir.of(workdir)
    if os.path.exists(workdir.path) and not os.path.isdir(workdir.path):
        raise ConfigError(f"--workdir: {workdir.path} exists and is not a folder")
    if os.path.isfile(workdir.results_path):
        experiment.keep_names(workdir.recorded_names())
    check_sources(experiment, workdir, allow_changed_task, interface, log)
    shares = prepare(experiment, workdir, index, count, jax.default_backend())
    with contextlib.ExitStack() as held:  # every recorded shard's lock first: none trains elsewhere meanwhile
        for j, _, _ in shares:
            held.enter_context(
                WorkdirLock(workdir, f"train --shard {index}/{count}", create=True, path=workdir.shard_lock_path(j))
            )
        held.enter_context(library_logs(workdir.log_path))
        payload = None
        for _, part, entry in shares:
            label = f"shard {index}/{count}" + (f" (recorded shard {entry['shard']})" if len(shares) > 1 else "")
            payload = _train_recorded(part, entry, label, progress, log)
        return payload


def _train_recorded(part: Part, entry: dict, label: str, progress: bool, log) -> dict:
    names = [m.name for m in part.experiment.members]
    log(f"{label}: {len(names)} members ({', '.join(names)}) in {part.workdir.checkpoints_dir}")
    for program in entry.get("split_programs", []):
        log(
            f"{label}: program {program} is split over shards (more shards than programs): its members here are "
            "computed in a smaller batch, so not bit for bit: float rounding at step 0 (~1e-6) that training "
            "amplifies (measured: final train_loss 1.4e-3 apart, relative, after 300 steps; docs/shards.md); "
            "at most as many shards as programs (train --dry-run lists them) give the one-job run's numbers"
        )
    return run(part.experiment, part.workdir, progress=progress, log=log)


def missing_line(workdir: Workdir) -> str | None:
    """A line naming the members results.json lacks while shards are still to finish, or None."""
    missing = workdir.missing_members()
    if not missing:
        return None
    shown = ", ".join(missing[:8]) + (", ..." if len(missing) > 8 else "")
    return f"{len(missing)} member{'s' * (len(missing) != 1)} of the sweep not trained yet (shards to finish): {shown}"
