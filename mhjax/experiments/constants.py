"""What each member carries into its program, one NamedTuple per experiment: a pytree that the
trainer stacks on the member axis (train/loop.stack_constants) and the recipes read by field
name, so a misspelt constant fails where it is read, not as a missing key at trace time."""

from __future__ import annotations

from typing import Any, NamedTuple


class SequenceConstants(NamedTuple):
    key: Any  # init and dropout: (seed, member name less the fields compared on shared draws)
    data_key: Any  # training data: (seed, task) only, so the head counts of a seed see the same data
    eval_key: Any  # the held-out set: (seed, task); (task) alone for a held-out split (text: sequence.eval_key)
    task_id: Any  # index of the member's (task, parameters) sampler in the recipe's tasks
    heads: Any  # the member's head count (traced where a program mixes head counts)
    learning_rate: Any


class MixtureConstants(NamedTuple):
    key: Any  # theta_0 (each head's decoder from fold_in(key, h)) and the Lanczos start
    tau: Any  # the decoders' init scale
    X: Any  # (n_max, T, d) training inputs of the member's seed, padded past its own n
    y: Any
    X_test: Any
    y_test: Any
    weights: Any  # 1 for the member's own n training examples, 0 for padding
    num_train: Any
    heads: Any
    head_mask: Any  # 1 for the member's own heads of H_max
    step_size: Any
    first_step: Any  # zero_plus_step's first GD step
    own_steps: Any  # the member's own K (steps past it are no-ops)
