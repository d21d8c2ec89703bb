"""The host loop: chunk after chunk of the jitted sweep, with logging, evaluation,
checkpoints and a progress bar between chunks."""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from mhjax.io.checkpoint import member_key
from mhjax.io.progress import Progress
from mhjax.io.tensorboard import MemberWriters, NoWriters
from mhjax.io.trace import NoTrace, TraceWriter
from mhjax.io.workdir import Workdir
from mhjax.train import ahead, engine, halving, peers, preempt, snapshots
from mhjax.train.console import Console
from mhjax.train.interrupt import Interrupted, StopOnSignal  # noqa: F401 (Interrupted: its home before)
from mhjax.train.placement import Placement
from mhjax.train.preempt import SharedStop, StopTimes, grace_seconds, interrupted, jax_preemption_service
from mhjax.train.records import HostRecords
from mhjax.train.resume_curves import prior_step_seconds, purged_everywhere, rewrite_resumed_step
from mhjax.train.run_end import write_end
from mhjax.train.scalars import log_chunk as _log_chunk
from mhjax.train.scalars import log_eval as _log_eval


def stack_constants(experiment, indices):
    per_member = [experiment.member_constants(experiment.members[i]) for i in indices]
    return jax.tree_util.tree_map(lambda *xs: np.stack(xs), *per_member)


class Sweep:
    """The members' programs, constants and states; usable without the host loop (tests)."""

    def __init__(self, experiment, backend: str | None = None, placement: Placement | None = None):
        """``placement``: where the member axis lives (default: this machine's devices, capped
        by config.devices); an abstract one (a compile target's) makes constants shapes only."""
        self.experiment = experiment
        self.backend = backend = backend or jax.default_backend()
        count = int(experiment.config.get("devices", 0) or 0)  # 0: every device
        self.placement = placement or Placement(jax.devices()[:count] if count else None)
        # how the sweep runs here (mhjax.plan): its programs, attention path and cost, made once
        self.plan = experiment.plan(backend, self.placement.size, planned=self.placement.abstract)
        self.programs = self.plan.programs
        self.consts = {
            p.name: self.placement.put(stack_constants(experiment, p.members), len(p.members)) for p in self.programs
        }
        # What the host accumulates for results.json (the exact losses at the experiment's
        # loss_steps()), saved with every checkpoint.
        self.records = HostRecords([m.name for m in experiment.members], experiment.loss_steps())
        self._jit()

    def _jit(self) -> None:
        self._chunks, self._pieces = {}, {}
        self._evaluate = {p.name: engine.make_evaluate(p.recipe, self._mesh(p)) for p in self.programs}
        self._init = {
            p.name: engine.make_init(p.recipe, self.placement.sharding(len(p.members)), self._mesh(p))
            for p in self.programs
        }

    def _mesh(self, program):
        """Where ``program`` runs per device on its shard of the member axis (engine.per_shard)."""
        return self.placement.mesh_for(len(program.members))

    def rebuild(self, plan) -> None:
        """Run ``plan``'s programs, after the plan changed how they compute (a kernel that failed
        to compile: train/ahead.py). Members stay in the same programs and order, so constants,
        records and states stay valid."""
        if [(p.name, p.members) for p in plan.programs] != [(p.name, p.members) for p in self.programs]:
            raise RuntimeError("Sweep.rebuild: the plan's programs changed their members")
        self.plan, self.programs = plan, plan.programs
        self._jit()

    def use(self, executables: dict) -> None:
        """Call these compiled executables (train/ahead.py keys) instead of jitting on first use."""
        for key, executable in executables.items():
            role, name = key[:2]
            if role == "init":
                self._init[name] = executable
            elif role == "chunk":
                self._chunks[(name, key[2])] = executable
            elif role == "piece":
                self._pieces[(name, key[2])] = executable
            else:
                self._evaluate[name] = executable

    def init_states(self):
        return {p.name: self._init[p.name](self.consts[p.name]) for p in self.programs}

    def host(self, tree):
        """Device values -> numpy on this process (gathered across processes)."""
        return self.placement.to_host(tree)

    def abstract_states(self, sharded: bool = False):
        """{program: its stacked states' shapes and dtypes}; ``sharded``: with their placement."""
        out = {}
        for p in self.programs:
            shapes = jax.eval_shape(engine.make_init(p.recipe), self.consts[p.name])
            out[p.name] = ahead.abstract(shapes, self.placement.sharding(len(p.members))) if sharded else shapes
        return out

    # Checkpoints hold one entry per MEMBER (not per program), so a sweep can resume under
    # another strategy, backend or device count, and tools can read any member directly.
    def member_states(self, states) -> dict:
        """{member name: its own (unstacked) MemberState}."""
        members = engine.unstack(self.programs, self.host(states))
        return {self.experiment.members[i].name: state for i, state in members.items()}

    def stack_members(self, members: dict):
        names = [m.name for m in self.experiment.members]
        return {
            p.name: self.placement.put(
                jax.tree_util.tree_map(lambda *xs: np.stack(xs), *[members[names[i]] for i in p.members]),
                len(p.members),
            )
            for p in self.programs
        }

    def save(self, checkpointer, step: int, states, seconds: dict) -> None:
        members = {member_key(k): v for k, v in self.member_states(states).items()}
        tree = {"members": members, "seconds": {member_key(k): np.float32(v) for k, v in seconds.items()}}
        checkpointer.save(step, tree, records=self.records.to_json())

    def restore(self, checkpointer, step: int):
        """(stacked states, {member name: training seconds}) from checkpoint ``step``; the host
        records saved with it replace ``records``. A checkpoint written before the loss-path
        fields (engine.PATH_FIELDS) existed restores without them, which start unknown."""
        names = [m.name for m in self.experiment.members]
        unstacked = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape[1:], x.dtype), self.abstract_states())
        old = not engine.has_path_fields(checkpointer.stored_tree(step))
        abstract = {}
        for p in self.programs:
            for i in p.members:
                state = unstacked[p.name]
                abstract[member_key(self.experiment.members[i].name)] = engine.without_path(state) if old else state
        seconds = {member_key(n): jax.ShapeDtypeStruct((), jnp.float32) for n in names}
        tree = checkpointer.restore(step, {"members": abstract, "seconds": seconds})
        self.records.load_json(checkpointer.restore_records(step), step)
        members = {n: tree["members"][member_key(n)] for n in names}
        self.path_from = step if old else 0  # the loss path is checked from this step on
        if old:
            members = {n: engine.with_path(state) for n, state in members.items()}
        return self.stack_members(members), {n: float(tree["seconds"][member_key(n)]) for n in names}

    # The functions the host loop calls, jitted once here; train/ahead.py compiles these same
    # functions and hands the executables back through ``use``.
    def init_fn(self, program):
        return self._init[program.name]

    def evaluate_fn(self, program):
        return self._evaluate[program.name]

    def chunk_fn(self, program, length: int):
        fn = self._chunks.get((program.name, length))
        if fn is None:
            fn = self._chunks[(program.name, length)] = engine.make_train_chunk(
                program.recipe, length, self._mesh(program)
            )
        return fn

    def piece_fn(self, program, length: int):
        fn = self._pieces.get((program.name, length))
        if fn is None:
            fn = self._pieces[(program.name, length)] = engine.make_partial_chunk(
                program.recipe, length, self._mesh(program)
            )
        return fn

    def run_chunk(self, program, states, length: int):
        return self.chunk_fn(program, length)(states, self.consts[program.name])

    def run_piece(self, program, states, length: int, piece_length: int):
        """``length`` steps by the pieces' program of ``piece_length`` steps (its metric rows cut to ``length``)."""
        states, metrics = self.piece_fn(program, piece_length)(states, self.consts[program.name], np.int32(length))
        return states, jax.tree_util.tree_map(lambda x: x[:length], metrics)

    def record(self, program, losses, start: int) -> None:
        """Keep the wanted exact losses of a chunk that started at step ``start`` (host ``losses``:
        (chunk, members))."""
        self.records.record_losses(program.members, losses, start)

    def train(self, states, steps: int, chunk: int):
        """Plain training without I/O: advance every program by ``steps``, recording the losses
        at the experiment's loss steps like the host loop does."""
        start = int(np.max(self.host(states[self.programs[0].name].step))) if self.records.wanted.size else 0
        done = 0
        while done < steps:
            n = min(chunk, steps - done)
            for p in self.programs:
                states[p.name], metrics = self.run_chunk(p, states[p.name], n)
                if self.records.wanted.size:
                    self.record(p, self.host(metrics["loss"]), start + done)
            done += n
        return states

    def evaluate(self, states):
        out = {}
        for p in self.programs:
            metrics = self.host(self._evaluate[p.name](states[p.name], self.consts[p.name]))
            for j, i in enumerate(p.members):
                out[i] = self.experiment.evaluation_fields(i, {k: float(v[j]) for k, v in metrics.items()})
        return out


def run(experiment, workdir, progress: bool = True, log=print) -> dict:
    """Train (or resume) the sweep in ``workdir`` (a Workdir or its path); returns the results
    payload. Diverged members are named at the end (train/status.py)."""
    workdir = Workdir.of(workdir)
    config = experiment.config
    grace = grace_seconds(config)  # a bad value stops here, before the workdir is written
    # With several processes (jax.distributed) only process 0 writes metadata, logs and results;
    # every process takes part in checkpoints (orbax coordinates them).
    primary = jax.process_index() == 0
    console = Console(log, progress and primary)
    log = console.log
    if not workdir.has_checkpoints():  # a fresh run: its start checked before the workdir is written
        experiment.check_start()
    metadata = (config.to_dict(), experiment.kind, experiment.metadata(), experiment.cannot_extend)
    resuming = workdir.check_or_write_metadata(*metadata, experiment.config_defaults) if primary else True
    rungs = halving.Halving(experiment, workdir, log)  # a no-op unless config.train.halving
    checkpointer = workdir.checkpointer()
    latest = checkpointer.latest_step() if resuming else None
    everyone, experiment = experiment.members, rungs.experiment_at(latest or 0)  # the survivors of its rungs
    sweep = Sweep(experiment)
    sweep.placement.say_programs(sweep, log)  # with several processes: which computes what
    members = experiment.members
    total, chunk = config.train.steps, config.train.chunk_steps
    step = int(latest or 0)
    Progress(workdir, [m.name for m in members], total, step, write=primary).starting()  # for mhjax status
    writers, snaps = NoWriters(), snapshots.Snapshots(sweep, workdir, snapshots.steps_of(config))
    stop = StopOnSignal(
        where="after the compile: nothing is trained before the programs are ready",
        own_sigterm=jax.process_count() == 1 or not jax_preemption_service(),  # else JAX's own handler
    )
    last_stop = preempt.MeasuredStop.read(preempt.stop_path(workdir))  # its close and exit count in the prediction
    shared, times = SharedStop(stop), StopTimes(grace, chunk, last_stop=last_stop)
    try:
        stop.start()
        if latest is not None:  # before compiling: a corrupt checkpoint is reported at once
            states, seconds = sweep.restore(checkpointer, latest)
            log(f"resuming from checkpoint at step {latest}")
            times = StopTimes(grace, chunk, prior_step_seconds(sweep, seconds, latest), last_stop)
            if last_stop and last_stop.get("step") == latest:
                log(preempt.MeasuredStop.line(last_stop))
            if sweep.records.starts_at and sweep.records.wanted.size:
                log(f"checkpoint {latest} predates recorded loss points: loss_curve starts at step {latest}")
            if sweep.path_from:
                log(f"checkpoint {latest} predates the loss-path records: divergence is checked from step {latest} on")
        names = [m.name for m in everyone]
        # Resumed (or started again after a kill before any checkpoint): points a killed process
        # wrote at steps >= ``step`` are dropped, as W/trace cuts its files (io/trace.py).
        purge = step if step < total else None  # a finished run's points (analysis included) stay
        writers = MemberWriters(workdir.tensorboard_dir, names, log=log, purge_step=purge) if primary else NoWriters()
        traces = TraceWriter(workdir.trace_dir, step) if primary else NoTrace()  # W/trace, from ``step`` on
        hparams = {m.name: m.flat_hparams() for m in everyone}
        writers.start(config.to_dict(), hparams, step)  # config text and HParams session starts
        evals = sorted(set(experiment.eval_steps()))
        # the first chunk cut at early evaluations, any chunk at snapshot steps (train/snapshots.py)
        plan = ahead.chunk_plan(step, total, chunk, splits=evals, anywhere=snaps.steps)
        ahead.compile_run(sweep, console, plan, init=latest is None)
        stop.where, stop.preparing = "at the end of the running chunk", False
        log(times.start_line())
        if latest is None:
            states, seconds = sweep.init_states(), {m.name: 0.0 for m in members}
        reported_divergence, evaluation = rungs.reported, None  # (member index, event); renumbered at rungs
        factor, every = experiment.divergence_factor(), experiment.log_every_step  # train/... at every step?
        started, trained = time.perf_counter(), 0
        if 0 in evals and step == 0:
            _log_eval(writers, members, sweep.evaluate(states), 0)
        if purged_everywhere(writers) and latest is not None:  # what the purge dropped at ``step``, again
            evaluation = rewrite_resumed_step(workdir, experiment, sweep, states, writers, step, evals, _log_eval)
            again = "; its evaluation written again" if evaluation is not None else ""
            if writers.purged:  # process 0's, which writes them
                log(f"tensorboard: points of earlier runs at steps >= {step} dropped (purge_step {step}){again}")
        snaps.take(step, states)  # step 0, or a resumed step newly asked for
        if latest is not None:  # snapshot steps newly asked for before it (train/snapshots.py)
            snaps.take_passed(latest, log)
        console.start(total, step)
        since = step  # the last stop that was not a snapshot's cut
        progress = Progress(workdir, names, total, step, write=primary)  # W/progress.json: mhjax status
        progress.update(step)
        for n, piece in plan.lengths():
            if stop.raised and not trained and shared.processes == 1:  # before any chunk: nothing to save
                raise interrupted(stop, step, workdir.path, saved=False)
            chunk_time = 0.0
            for program in sweep.programs:
                name, idx = program.name, program.members
                start = time.perf_counter()
                if piece:
                    states[name], metrics = sweep.run_piece(program, states[name], n, plan.piece_length)
                else:
                    states[name], metrics = sweep.run_chunk(program, states[name], n)
                # One device-to-host transfer per program and chunk: the metrics, status and stop flags.
                metrics, status, flags = sweep.host((metrics, engine.member_status(states[name]), shared.flag()))
                metrics = experiment.check_chunk(program, metrics, step)  # may stop the run: nothing saved
                elapsed = time.perf_counter() - start
                for i in idx:  # a program's members share its wall time
                    seconds[members[i].name] += elapsed
                chunk_time += elapsed
                traces.append([members[i].name for i in idx], metrics.pop("trace", None), step)
                rates = experiment.learning_rates(idx, step, n)  # per step, from the schedule (or None)
                _log_chunk(
                    writers, members, idx, metrics, status, step + n, reported_divergence, log, factor, every, rates
                )
                sweep.record(program, metrics["loss"], step)
            rate = n * len(members) / max(chunk_time, 1e-9)
            halt = shared.now(flags)  # every process the same answer (train/preempt.py)
            times.chunk(chunk_time, n, log)
            perf = {f"perf/{k}": v for k, v in experiment.throughput(rate).items() if v is not None}
            for m in members:
                writers.scalars(m.name, {"perf/member_steps_per_s": rate, **perf}, step + n)
            step += n
            trained += n
            console.advance(n, step, rate, time.perf_counter() - started)
            # Evaluations and checkpoints fall as in a run without snapshots: not at a snapshot's
            # cut, and at other stops for what was crossed since the last of those (``since``).
            regular = step % chunk == 0 or step == total or (step < chunk and step in evals)
            previous, since = (since, step) if regular else (step, since)
            progress.update(step, {members[i].name for i, _ in reported_divergence})
            wanted_eval = any(previous < k <= step for k in evals)
            if _crossed(previous, step, config.train.eval_every) or step == total or wanted_eval or rungs.due(step):
                evaluation = sweep.evaluate(states)
                _log_eval(writers, members, evaluation, step)
            if rungs.due(step):  # the survivors train on in programs of their own (train/halving.py)
                recompile = lambda s: ahead.compile_run(s, console, plan, init=False)  # noqa: E731
                sweep, states, evaluation = rungs.rung(sweep, states, evaluation, seconds, step, Sweep, recompile)
                if rungs.ended:  # every member stopped
                    break
                experiment, members, snaps.sweep = sweep.experiment, sweep.experiment.members, sweep
            snaps.take(step, states)  # before the checkpoint: resumed, a step is taken again or kept
            due = _crossed(previous, step, config.train.checkpoint_every) or step == total or rungs.due(step)
            if due or halt:
                saving = time.perf_counter()
                writers.flush()  # every point up to ``step`` on disk before the checkpoint commits it
                sweep.save(checkpointer, step, states, seconds)
                times.saved(time.perf_counter() - saving, log)
            if halt and step < total:
                if primary:  # its times, for the next run's prediction (W/stop.json)
                    preempt.MeasuredStop(preempt.stop_path(workdir), stop, step, times)
                raise interrupted(stop, step, workdir.path, saved=True)
        stop.close()
        console.close()  # the final lines start on a line of their own
        # results, the final scalars and images, figures and notes (train/run_end.py)
        return write_end(
            experiment, workdir, sweep, states, writers, hparams, evaluation=evaluation, seconds=seconds, step=step,
            latest=latest, trained=trained, started=started, primary=primary, log=log, rungs=rungs,
        )  # fmt: skip
    except Exception as exc:
        if peers.lost(exc):  # now: the finally's barrier would wait for the lost process, then abort
            peers.exit_requeue(exc, workdir.checkpoints_dir, preempt.resume_command(workdir.path))
        raise
    finally:
        stop.close()
        console.close()
        writers.close()
        snaps.close()
        checkpointer.close()
        if jax.process_count() > 1:  # leave together, or the shutdown barrier times out
            multihost_utils.sync_global_devices("mhjax:run-end")


def _crossed(previous: int, step: int, every: int) -> bool:
    return every > 0 and previous // every != step // every
