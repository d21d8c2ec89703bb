"""Copy, cycle and zero tasks (arXiv 2507.02944, Section 4) and the two training protocols,
for any registered task (mhjax.data.tasks).

Both protocols are pure functions of (key, step) so a member's data does not depend on the
program it runs in and a resumed run sees the same batches:
- "fixed": the paper's N fixed sequences, reshuffled every epoch. Sequence i is
  ``sample(fold_in(dataset_key, i))``, so the dataset is never stored.
- "fresh": new sequences every step (the task's batched form when it has one).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mhjax.data.tasks import Batch, Task, get_task, register_task

TASKS = ("copy", "cycle", "zero")  # the paper's tasks (its released checkpoints)
PROTOCOLS = ("fixed", "fresh")


def targets_for(task_id, tokens):
    """tokens (..., T) -> targets (..., T). task_id indexes TASKS (may be traced).

    cycle: target[t] = input[t-1], target[0] = input[T-1] (not visible to a causal model).
    """
    copy = tokens
    cycle = jnp.roll(tokens, 1, axis=-1)
    zero = jnp.zeros_like(tokens)
    return jax.lax.select_n(jnp.asarray(task_id, jnp.int32), copy, cycle, zero)


def random_sequences(key, num: int, length: int, vocab_size: int):
    """(num, length) int32 uniform tokens."""
    return jax.random.randint(key, (num, length), 0, vocab_size, dtype=jnp.int32)


def _uniform_task(task_id: int):
    """The sample, batched and targets forms of a task on uniform random tokens."""

    def targets(tokens):
        return targets_for(task_id, tokens)

    def sample(key, length, vocab_size):
        tokens = jax.random.randint(key, (length,), 0, vocab_size, dtype=jnp.int32)
        return tokens, targets(tokens), jnp.ones((length,), jnp.float32)

    def batch(key, num, length, vocab_size):
        tokens = random_sequences(key, num, length, vocab_size)
        return tokens, targets(tokens), jnp.ones((num, length), jnp.float32)

    sample.__qualname__ = sample.__name__ = TASKS[task_id]  # its source: mhjax.data.sequences:copy, ...
    return sample, batch, targets


for _id, _name in enumerate(TASKS):
    _sample, _batch, _targets = _uniform_task(_id)
    register_task(_name, _sample, batch=_batch, targets=_targets)


def epoch_batch_indices(shuffle_key, step, num_train: int, batch_size: int):
    """Indices of batch ``step`` under per-epoch reshuffling (incomplete last batch dropped)."""
    steps_per_epoch = num_train // batch_size
    epoch, within = jnp.divmod(step, steps_per_epoch)
    order = jax.random.permutation(jax.random.fold_in(shuffle_key, epoch), num_train)
    return jax.lax.dynamic_slice_in_dim(order, within * batch_size, batch_size)


def _tasks(tasks) -> list[Task]:
    return [t if isinstance(t, Task) else get_task(t) for t in tasks]


def _switch(task_id, tasks: list[Task], draw) -> Batch:
    """draw(task) for the member's task: ``task_id`` (maybe traced) indexes ``tasks``."""
    if len(tasks) == 1:
        return draw(tasks[0])
    return Batch(*jax.lax.switch(jnp.asarray(task_id, jnp.int32), [lambda t=t: tuple(draw(t)) for t in tasks]))


def train_batch(
    keys,
    task_id,
    step,
    *,
    protocol: str,
    num_train: int,
    batch_size: int,
    length: int,
    vocab_size: int,
    tasks=TASKS,
) -> Batch:
    """keys: dict with 'dataset', 'shuffle' and 'fresh' keys; ``task_id`` indexes ``tasks``
    (names or Task objects). Returns a Batch of (B, T) arrays."""
    tasks = _tasks(tasks)
    if protocol == "fixed":
        idx = epoch_batch_indices(keys["shuffle"], step, num_train, batch_size)
        return _switch(task_id, tasks, lambda t: t.dataset(keys["dataset"], idx, length, vocab_size))
    fresh = jax.random.fold_in(keys["fresh"], step)
    return _switch(task_id, tasks, lambda t: t.draw(fresh, batch_size, length, vocab_size))


def eval_batch(eval_key, task_id, num: int, length: int, vocab_size: int, tasks=TASKS) -> Batch:
    """Held-out sequences from their own key (never the training keys); a task with a heldout
    form (text: windows of the held-out part) draws them there."""
    return _switch(task_id, _tasks(tasks), lambda t: t.draw_eval(eval_key, num, length, vocab_size))
