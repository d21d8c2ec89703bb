"""What a run writes once its training ends (train/loop.run): the throughput line, results.json
and results.md, the final TensorBoard scalars and images, the experiment's figures and the
closing notes on the console.

The images: every member's attention maps and diffusion to the sink, and its held-out accuracy by
position. ``MHJAX_IMAGES=0`` leaves them out: drawing costs about a second per member on a CPU
(matplotlib), which a sweep of hundreds of members, or a test suite of many tiny runs, may not
want. Scalars, results and checkpoints are the same either way; ``mhjax analyze`` draws its own images."""

from __future__ import annotations

import os
import time

from mhjax.analysis.comparisons import results_comparisons
from mhjax.plotting import draw as draw_figures
from mhjax.plotting.images import member_images, position_image
from mhjax.plotting.paired import console_lines, results_tables
from mhjax.train import status as member_status
from mhjax.train.console import throughput_text
from mhjax.train.payload import results_payload

ENV = "MHJAX_IMAGES"


def write_end(
    experiment, workdir, sweep, states, writers, hparams, *, evaluation, seconds, step, latest, trained, started,
    primary, log, rungs,
) -> dict:  # fmt: skip
    """Write the end of a run that stopped at ``step`` (resumed from checkpoint ``latest`` or None,
    ``trained`` steps since ``started``, a perf_counter time; ``evaluation``: the loop's last one,
    of these very ``states``, or None; ``rungs``: train/halving.Halving, the members stopped at its
    rungs); returns the results as written (every process: its payload)."""
    members, total = experiment.members, experiment.config.train.steps
    throughput = {}  # this run's rates (experiment.throughput), when it trained
    if latest is not None and latest >= total:
        log(f"training already complete at step {latest}; not retraining")
    elif primary and trained:
        wall = time.perf_counter() - started
        member_steps = rungs.member_steps_between(step - trained, step)  # fewer after a halving rung
        speed = member_steps / max(wall, 1e-9)
        rates = experiment.throughput(speed)  # results.json keeps them where the experiment has any
        throughput = {"member_steps_per_s": speed, **rates} if rates else {}
        log(
            f"trained {trained} steps x {len(members)} members{rungs.since_text(member_steps)} in {wall:.1f} s: "
            f"{speed:,.0f} member-steps/s{throughput_text(throughput)} (with logging and evaluation)"
        )
    if evaluation is None:  # else the loop's last evaluation is of this very state
        evaluation = sweep.evaluate(states)
    payload = results_payload(experiment, sweep, states, evaluation, seconds, step, resumed_from=latest)
    payload.update(throughput)  # with logging and evaluation
    payload = rungs.finish(payload, total)  # with the members stopped at rungs (train/halving.py)
    # with any other part's members; results.md with head counts paired on held-out windows
    # results.json's "comparisons": head counts at their selected settings (analysis/comparisons.py)
    written = workdir.write_results(payload, results_tables, results_comparisons) if primary else payload
    description = f"{payload['title']}: {len(members)} members, {step} steps"
    again = latest is not None and latest >= total  # its final/ scalars may be on disk: not twice
    writers.finish(payload["members"], hparams, experiment.metric_tags(), step, description, again)
    # Host copies are gathered by EVERY process (a collective); then only process 0 draws.
    member_states = sweep.member_states(states)
    if primary:
        write_images(experiment, writers, member_states, step, log, payload["members"])
        # experiment-specific figures and summaries, once every shard's members are in (io/parts.py)
        for request in experiment.figures(written) if not written.get("missing_members") else ():
            draw_figures(workdir, request, log)
        notes = member_status.diverged_lines(written["members"]) + experiment.result_notes(written)
        for line in notes + console_lines(written):  # and the head counts compared (plotting/paired.py)
            log(line)
    return written


def images_wanted() -> bool:
    """False where ``$MHJAX_IMAGES`` is ``0`` (unset or anything else: drawn)."""
    return os.environ.get(ENV, "1").strip() != "0"


def write_images(experiment, writers, member_states: dict, step: int, log, records: list[dict]) -> None:
    """Draws and writes the images at ``step``; a failure is one logged line, never a lost run."""
    if not images_wanted():
        return
    try:
        for name, images in experiment.images(member_states, step).items():
            writers.images(name, images, step)
        for name, (attention, combined) in experiment.attention_maps(member_states).items():
            writers.images(name, member_images(name, attention, combined), step)
        for record in records:  # results per position (an experiment's extra_results) as a line
            if record.get("eval_accuracy_by_position"):
                image = position_image(record["eval_accuracy_by_position"], record["name"])
                writers.images(record["name"], {"eval/accuracy_by_position": image}, step)
        writers.flush()
    except Exception as exc:  # figures must never cost a finished training run
        log(f"tensorboard: end-of-training images skipped ({type(exc).__name__}: {exc})")
