"""Copy, cycle and zero tasks as pure functions of a PRNG key (the tasks of arXiv 2507.02944, Section 4).

Two training protocols, both pure functions of (key, step) so a member's data does
not depend on the program it runs in and a resumed run sees the same batches:
- "fixed": the paper's N fixed sequences, reshuffled every epoch. Sequence i is
  generated from fold_in(dataset_key, i), so the dataset is never stored.
- "fresh": new sequences every step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

TASKS = ("copy", "cycle", "zero")
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


def dataset_sequences(dataset_key, indices, length: int, vocab_size: int):
    """Sequences of a fixed dataset by index: row i is a function of (dataset_key, i) alone."""

    def one(i):
        return jax.random.randint(jax.random.fold_in(dataset_key, i), (length,), 0, vocab_size, dtype=jnp.int32)

    return jax.vmap(one)(indices)


def epoch_batch_indices(shuffle_key, step, num_train: int, batch_size: int):
    """Indices of batch ``step`` under per-epoch reshuffling (incomplete last batch dropped)."""
    steps_per_epoch = num_train // batch_size
    epoch, within = jnp.divmod(step, steps_per_epoch)
    order = jax.random.permutation(jax.random.fold_in(shuffle_key, epoch), num_train)
    return jax.lax.dynamic_slice_in_dim(order, within * batch_size, batch_size)


def train_batch(keys, task_id, step, *, protocol: str, num_train: int, batch_size: int, length: int, vocab_size: int):
    """keys: dict with 'dataset', 'shuffle' and 'fresh' keys. Returns (inputs, targets), (B, T) each."""
    if protocol == "fixed":
        idx = epoch_batch_indices(keys["shuffle"], step, num_train, batch_size)
        tokens = dataset_sequences(keys["dataset"], idx, length, vocab_size)
    else:
        tokens = random_sequences(jax.random.fold_in(keys["fresh"], step), batch_size, length, vocab_size)
    return tokens, targets_for(task_id, tokens)


def eval_batch(eval_key, task_id, num: int, length: int, vocab_size: int):
    """Held-out sequences from their own key (never the training keys)."""
    tokens = random_sequences(eval_key, num, length, vocab_size)
    return tokens, targets_for(task_id, tokens)
