"""results.json's payload at the end of a run: one record per member from its final state, its
evaluation and the experiment's extra results (train/status.py says what its status means).

Fields and the theta they are taken at (K = the run's last step):
* ``train_loss``: the training loss of the last step, the loss of theta_{K-1} on that step's batch
  (a sequence member's last minibatch, with dropout); an experiment may replace it (the mixture:
  L(theta_K), the full-batch loss after the last step);
* ``initial_train_loss``, ``max_train_loss``: the step-0 loss (of theta_0) and the maximum over
  the training losses of theta_0 .. theta_{K-1};
* the evaluation's fields (``eval_*``, ``test_*``, ...): at theta_K;
* ``status``, ``diverged_at_step``, ``diverged_reason``, ``loss_exceeded_at_step``,
  ``nonfinite_at_step``: over the whole path (train/status.py).
"""

from __future__ import annotations

import jax
import numpy as np

from mhjax.train import engine
from mhjax.train import status as member_status


def results_payload(experiment, sweep, states, evaluation, seconds, step, resumed_from):
    records = [None] * len(experiment.members)
    factor = experiment.divergence_factor()
    for p in sweep.programs:
        s = states[p.name]
        status, steps, losses = sweep.host((engine.member_status(s), s.step, s.last_loss))
        for j, i in enumerate(p.members):
            member = experiment.members[i]
            record = {"name": member.name, **member.hparams, **experiment.member_info(member)}
            if i in sweep.records.loss_curves:
                record["loss_curve"] = sweep.records.loss_curves[i]
            record.update(
                steps=int(steps[j]),
                train_loss=float(losses[j]),
                **evaluation[i],
                # the member's program's training time, which its members share; wall_time_s: its older name;
                # in float32 as checkpoints keep it, so that a run resumed where it ended says the same
                **dict.fromkeys(("program_wall_time_s", "wall_time_s"), float(np.float32(seconds[member.name]))),
                program=p.name,
                **member_status.path_fields(status, j, factor),
            )
            records[i] = record
    trained = [engine.TrainedProgram(p, sweep.consts[p.name], states[p.name]) for p in sweep.programs]
    for i, extra in experiment.extra_results(trained, sweep.records.loss_curves).items():
        member_status.merge(records[i], extra)
    return {
        "experiment": experiment.kind,
        "analyzable": experiment.analyzable,
        "title": f"mhjax {experiment.kind} sweep",
        "steps": step,
        "resumed_from_step": resumed_from,
        "backend": jax.default_backend(),
        **sweep.plan.results_fields(),  # how attention was computed (and why it fell back)
        **experiment.results_fields(jax.default_backend()),
        "programs": {p.name: [experiment.members[i].name for i in p.members] for p in sweep.programs},
        "members": records,
    }
