"""``Run``: a trained (or training) sweep's workdir, read from Python: its results, curves,
checkpoints and snapshots, members' parameters and models, and what ``mhjax analyze``,
``mhjax report``, ``mhjax sample`` and the forward with internals do on it. ``mhjax.load`` and
``mhjax.sweep`` return one (mhjax/api/__init__.py)."""

from __future__ import annotations

import os
import warnings

from mhjax.api.wording import python_errors
from mhjax.config import ConfigError
from mhjax.experiments.architecture import FIELDS as ARCHITECTURE
from mhjax.io.lock import WorkdirLock
from mhjax.workflows import members
from mhjax.workflows.analyze import analyze_workdir
from mhjax.workflows.forward import member_forward
from mhjax.workflows.report import stale_line, write_report
from mhjax.workflows.sample import member_sample
from mhjax.workflows.workdir import open_workdir

ANALYZE_OPTIONS = (
    "out",
    "sequences",
    "num_sequences",
    "seed",
    "horizon",
    "max_steps",
    "chain",
    "include_sink",
    "batch_size",
    "ablate",
    "tensorboard",
    "plot",
    "allow_changed_task",
    "members",
)


class Run:
    """A trained (or training) sweep's workdir, opened by workflows/workdir.py and read on demand
    through its Workdir (mhjax/io/workdir.py: each file read once while unchanged, again once it
    changed); no task code runs until ``analyze``."""

    @python_errors
    def __init__(self, workdir):
        self.workdir = os.fspath(workdir)
        self._opened = open_workdir(self.workdir, interface="python")
        self._files = self._opened.files
        self.config = self._opened.config  # reads W/mhjax.json: a folder that is not a workdir fails here

    def __repr__(self) -> str:
        return f"Run({self.workdir!r})"

    @property
    @python_errors
    def results(self) -> list[dict]:
        """One dict per member, as in W/results.json."""
        return self._files.results()["members"]

    @property
    def member_names(self) -> list[str]:
        return self._files.recorded_names()  # while it trains (no results.json yet): its latest checkpoint's

    @python_errors
    def status(self) -> dict:
        """Where the sweep is, read while it may be training: {"workdir", "holder_pid", "total_steps",
        "members": [{name, part, state, step, checkpoint_step, checkpoint_age_s, member_steps_per_s,
        eta_s}], "shards": [{shard, folder, state, step, holder_pid, members, eta_s}] (a sweep in
        shards; [] otherwise)}, state: starting, training, done, diverged, stopped or missing (io/sweep_state.py)."""
        from mhjax.io.sweep_state import sweep_status

        return sweep_status(self._files)

    @property
    @python_errors
    def missing_members(self) -> list[str]:
        """The sweep's members not in results.json yet: those of shards still training
        (``mhjax train --shard I/N``, docs/shards.md); [] once every member is in."""
        return self._files.missing_members()

    @property
    def checkpoint_steps(self) -> list[int]:
        """The steps of the kept checkpoints (the two latest), ascending."""
        return self._files.checkpoint_steps()

    @property
    def snapshot_steps(self) -> list[int]:
        """The steps of the snapshots (config.train.snapshot_steps: parameters kept for good), ascending."""
        return self._files.snapshot_steps()

    @python_errors
    def params(self, name: str, step: int | None = None):
        """Member ``name``'s parameter tree at ``step`` (default: the latest checkpoint; another
        step needs a kept checkpoint or a snapshot: ``checkpoint_steps``, ``snapshot_steps``). A
        mixture member's come cut to its own head count."""
        return members.params(self._opened, name, step)

    @python_errors
    def data(self, seed: int):
        """(mixture) The seed's data as the run drew it: ``x_train, y_train`` (its largest n) and
        ``x_test, y_test``."""
        return members.data(self._opened, seed)

    @python_errors
    def theta0(self, name: str):
        """(mixture) theta_0 of member ``name`` as training drew it, cut to its own heads."""
        return members.theta0(self._opened, name)

    @python_errors
    def model(self, name: str):
        """A pure ``apply(params, X)`` of member ``name``'s model: sequence sweeps, tokens (N, T) ->
        logits (N, T, V) in eval mode (``run.model(m)(run.params(m), tokens)`` equals
        ``run.forward(m, tokens).logits``); mixture, (N, T, d) -> (N,) at its own head count, with
        the run's phi; params as ``params`` and ``theta0`` return them."""
        return members.model(self._opened, name)

    @python_errors
    def ntk(self, name: str, step: int = 0):
        """(mixture) Member ``name``'s NTK at ``step`` (0: theta_0; else a kept checkpoint or a snapshot) on its
        own n examples: a record with ``gram`` (n x n), ``margin`` (results.json's ntk_margin at
        step 0, with the run's margin_iters and margin_tol), ``gap`` and ``radius``."""
        return members.ntk(self._opened, name, step)

    @python_errors
    def trace(self, name: str):
        """(mixture) Member ``name``'s per-step trace as numpy arrays, keys and attributes alike
        (``t["loss"]`` or ``t.loss``): ``step`` and, at theta_step, ``loss``, ``margin``
        (min_i y_i Phi_i / ||theta||), ``grad_norm_over_loss`` and ``param_norm``; every step up
        to 10^4, log-spaced beyond (W/trace, written as it trains)."""
        return members.trace(self._opened, name)

    @python_errors
    def curves(self, name: str) -> dict:
        """{tag: (steps, values)} of member ``name``'s TensorBoard scalars."""
        return self._files.curves(self._member(name))

    def _member(self, name: str) -> str:
        if name not in self.member_names:
            raise ConfigError(f"member: unknown {name!r} (members: {', '.join(self.member_names)})")
        return name

    @property
    def analysis(self) -> dict | None:
        """W/analysis/analysis.json; None until analysed (``run.analyze()``)."""
        return self._files.analysis() if self._files.has_analysis() else None

    @python_errors
    def analyze(self, steps=None, **options):
        """Sequence sweeps: ``mhjax analyze --workdir W`` with its options as keywords
        (ANALYZE_OPTIONS: out, sequences, num_sequences, seed, horizon, max_steps, chain,
        include_sink, batch_size, ablate, tensorboard, plot, allow_changed_task, members); returns the
        analysis dict. ``members``: globs of member names (``"copy-*"`` or a list), analysed and
        merged into analysis.json, the other members' entries kept. ``steps``: kept checkpoints
        and snapshots (``checkpoint_steps``, ``snapshot_steps``), "last" and "all" (the snapshots
        and the latest) among them, as ``--steps`` (default: the latest);
        the dict's ``by_step`` holds each step analysed, its top level the latest.

        Mixture sweeps: margins and Hessian quantities at ``steps`` (0, kept checkpoints and
        snapshots; "all": 0, the snapshots and the latest; default: 0 and the latest). Returns a list of
        records, one per (member, step): member, step, ntk_margin, ntk_margin_gap, ntk_radius
        and the evaluation's fields at that step (train_loss_eval, test_loss, test_accuracy,
        train_accuracy, hessian_min, hessian_max, step_times_hessian_max, distance_from_init;
        grad_norm_over_loss and min_hessian_eig_over_loss_sqrtH for a loss with an exponential
        tail)."""
        if self._opened.kind.analyzes_states:
            if options:
                raise ConfigError(f"analyze: a mixture sweep takes steps= only, got {', '.join(options)}")
            return members.analyze_steps(self._opened, steps)
        unknown = sorted(set(options) - set(ANALYZE_OPTIONS))
        if unknown:
            raise ConfigError(f"run.analyze: unknown option {unknown[0]!r} (options: {', '.join(ANALYZE_OPTIONS)})")
        with WorkdirLock(self.workdir, "analyze"):
            result = analyze_workdir(self._opened, steps=steps, **options)
        return result

    @python_errors
    def report(self, reference=None, importance_member: str | None = None) -> dict:
        """``mhjax report --workdir W``: W/report.md and its figures; returns {"md": path, "figures":
        [paths], ...}. ``reference``: a folder of released checkpoints to compare with;
        ``importance_member``: as ``--importance-member``. An analysis of another step than the
        results warns (UserWarning) how to refresh it."""
        with WorkdirLock(self.workdir, "report"):
            reference = None if reference is None else os.fspath(reference)
            result = write_report(self._opened, reference=reference, importance_member=importance_member)
        stale = result["stale_analysis"]
        if stale:  # report.md says so too
            warnings.warn(stale_line(stale["analysis"], stale["results"], self.workdir, "python"), stacklevel=3)
        return result

    @python_errors
    def forward(
        self,
        member: str,
        tokens,
        targets=None,
        weights=None,
        heads_off=None,
        allow_changed_task=False,
        patch=None,
        patch_tokens=None,
        patch_positions=None,
        step=None,
    ):
        """Member ``member`` (its latest checkpoint, or ``step``: a kept checkpoint or a snapshot;
        eval mode) on ``tokens`` (N, T): a
        :class:`mhjax.Forward` with logits, attention, head outputs, residual stream and, with
        targets, the per-token loss and loss and accuracy by position (weighted by ``weights``).
        ``targets`` default to the member's task's when it makes them from tokens (copy, cycle,
        zero), with the task's weights where its ``targets(tokens)`` gives them (positions it
        leaves undefined count nowhere; ``Forward.weights``); ``heads_off`` {layer: [head, ...]}
        (0-based) zeroes heads as the analysis does.
        A plug-in task whose source changed since training is refused, as by ``analyze``, unless
        ``allow_changed_task=True`` (stated on the Forward with the source's sha256); one that
        cannot be registered again warns why and leaves the loss fields None.
        Activation patching: ``patch`` {layer: [head, ...]} replaces those heads' outputs (at the
        output projection's input, where ``heads_off`` acts) with the ones this member computes on
        ``patch_tokens`` (the tokens' shape) in an unpatched run, at ``patch_positions`` only (None:
        all); the loss stays against the clean tokens' targets.
        One compile per model shape, and one more for any patch set (workflows/forward.py)."""
        return member_forward(
            self._opened,
            self._member(member),
            tokens,
            targets,
            weights,
            heads_off,
            allow_changed_task,
            patch,
            patch_tokens,
            patch_positions,
            step,
        )

    @python_errors
    def sample(
        self,
        member: str,
        prompt,
        tokens: int = 200,
        temperature: float = 1.0,
        top_k=None,
        seed: int = 0,
        step=None,
        vocab=None,
        join: str = " ",
    ):
        """``mhjax sample``: member ``member`` (its latest checkpoint, or ``step``: a kept
        checkpoint or a snapshot) continuing ``prompt`` by ``tokens`` tokens, each predicted from
        the last seq_len tokens by a full forward pass (learned positions: no key/value cache, none
        needed; one compile for any prompt and length). ``temperature`` 0: greedy; ``top_k``: among
        the k most likely (None: all); token i drawn with fold_in(PRNGKey(seed), i). ``prompt``:
        text for a byte file's members (UTF-8), token ids (a sequence, or "12 7 301") for the
        others, or tokens of ``vocab`` (a file, one token per line, line number = id, or a list).
        Returns a Sample: ``prompt_ids``, ``ids`` (the continuation), ``text`` (prompt and
        continuation decoded; None without bytes or a vocabulary), ``continuation``, ``step``,
        ``context`` (workflows/sample.py)."""
        return member_sample(
            self._opened, self._member(member), prompt, tokens, temperature, top_k, seed, step, vocab, join
        )

    def to_pandas(self):
        """results as a pandas DataFrame, one row per member (pandas is optional); a dict field
        such as ``task_params`` as columns ``task_params.<name>``; the swept architecture fields
        (``width``, ``num_layers``, ``mlp_dim``, ``dropout``, ``head_dim``) as columns, ``head_dim``
        None (parameter matching) beside integers a nullable integer column: None is ``<NA>``, 16 is
        16 (group with ``dropna=False`` to keep the parameter-matched members)."""
        try:
            import pandas as pd
        except ImportError:
            raise ImportError("Run.to_pandas needs pandas: pip install pandas") from None
        rows = []
        for m in self.results:  # lists (curves, per-position results) left out; task_params as task_params.<name>
            row = {k: v for k, v in m.items() if not isinstance(v, (dict, list))}
            row.update({f"{k}.{n}": x for k, v in m.items() if isinstance(v, dict) for n, x in v.items()})
            rows.append(row)
        frame = pd.DataFrame(rows)
        for field in ARCHITECTURE:  # pandas would make None beside 16 NaN beside 16.0
            values = [row.get(field) for row in rows]
            if (
                field in frame
                and None in values
                and all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in values)
            ):
                frame[field] = pd.array(values, dtype="Int64")
        return frame
