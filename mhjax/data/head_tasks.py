"""Built-in tasks that exercise attention heads: associative recall, induction, reversal, sorting.

Each is ``sample(key, length, vocab_size) -> (inputs, targets, weights)`` (mhjax.data.tasks)
with the model's convention: ``targets[t]`` is what the causal model must output at
position t, having seen inputs[0..t]; only positions with weight 1 count in the loss and
the accuracy. Sizes are derived from (length, vocab_size); each sampler states what it needs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from mhjax.data.tasks import register_task


def _ones_between(length: int, start, stop):
    """float32 (length,): 1 on [start, stop), 0 elsewhere (start, stop may be traced)."""
    t = jnp.arange(length)
    return ((t >= start) & (t < stop)).astype(jnp.float32)


def recall(key, length: int, vocab_size: int, pairs=None):
    """Multi-query associative recall (MQAR; Zoology, Arora et al. 2023, arXiv 2312.04927).

    The first 2P positions list P key-value pairs ``k0 v0 k1 v1 ...`` (distinct keys from the
    lower half of the vocabulary, values from the upper half); the rest are queries, each a key
    drawn from the pairs, whose target is that key's value. Measures recall of bindings made in
    context: a head must find the query's earlier occurrence and read the token after it, for
    every query at once. ``pairs`` (config.task_params.recall.pairs): P, None for length // 4;
    needs 1 <= P < length / 2 (one query at least) and P <= vocab_size // 2.
    """
    pairs = length // 4 if pairs is None else pairs
    if isinstance(pairs, bool) or not isinstance(pairs, int) or not 1 <= pairs < length / 2 or pairs > vocab_size // 2:
        raise ValueError(
            f"recall: pairs must be an integer in [1, {min((length - 1) // 2, vocab_size // 2)}] for length "
            f"{length} and vocab_size {vocab_size}, got {pairs!r}"
        )
    half = vocab_size // 2
    k_keys, k_values, k_queries = jax.random.split(key, 3)
    keys = jax.random.permutation(k_keys, half)[:pairs].astype(jnp.int32)
    values = jax.random.randint(k_values, (pairs,), half, vocab_size, dtype=jnp.int32)
    context = jnp.stack([keys, values], axis=1).reshape(-1)  # k0 v0 k1 v1 ...
    which = jax.random.randint(k_queries, (length - 2 * pairs,), 0, pairs)
    inputs = jnp.concatenate([context, keys[which]])
    targets = jnp.concatenate([context, values[which]])
    return inputs, targets, _ones_between(length, 2 * pairs, length)


def induction(key, length: int, vocab_size: int):
    """Induction heads (Olsson et al. 2022): a segment of L = length // 4 distinct tokens
    appears at a random place in the first half and again at a random place in the second,
    amid filler tokens not in the segment. Inside the repeat, the target is the next token:
    the one that followed the current token's previous occurrence. Measures the two-step
    circuit (previous-token head, then a head matching on it); the random offsets rule out
    a positional shortcut. Needs vocab_size > length // 4 and length >= 8.
    """
    seg = length // 4
    k_perm, k_fill, k_first, k_second = jax.random.split(key, 4)
    perm = jax.random.permutation(k_perm, vocab_size).astype(jnp.int32)
    segment = perm[:seg]
    filler = perm[seg + jax.random.randint(k_fill, (length,), 0, vocab_size - seg)]
    first = jax.random.randint(k_first, (), 0, length // 2 - seg + 1)
    second = jax.random.randint(k_second, (), length // 2, length - seg + 1)
    inputs = jax.lax.dynamic_update_slice(filler, segment, (first,))
    inputs = jax.lax.dynamic_update_slice(inputs, segment, (second,))
    targets = jnp.roll(inputs, -1)  # the next token
    return inputs, targets, _ones_between(length, second, second + seg - 1)


def _then_separator(key, length: int, vocab_size: int, transform):
    """inputs: x (n = length // 2 tokens from [0, vocab_size - 1)), the separator
    vocab_size - 1, then transform(x) shifted right (teacher forcing); targets transform(x)
    at the n positions from the separator on."""
    n = length // 2
    separator = vocab_size - 1
    x = jax.random.randint(key, (n,), 0, vocab_size - 1, dtype=jnp.int32)
    y = transform(x)
    pad = jnp.full((length - 2 * n,), separator, jnp.int32)  # odd length: one unweighted position
    inputs = jnp.concatenate([x, jnp.full((1,), separator, jnp.int32), y[:-1], pad])
    targets = jnp.concatenate([x, y, pad])
    return inputs, targets, _ones_between(length, n, 2 * n)


def reversal(key, length: int, vocab_size: int):
    """Reversal: a sequence x of length // 2 tokens, a separator (token vocab_size - 1), then
    x reversed, predicted token by token after the separator. Measures position-addressed
    copying: output j attends to input n - 1 - j. Needs vocab_size >= 2."""
    return _then_separator(key, length, vocab_size, lambda x: x[::-1])


def sorting(key, length: int, vocab_size: int):
    """Sorting: a sequence x of length // 2 tokens, a separator (token vocab_size - 1), then
    x sorted ascending, predicted token by token after the separator. Measures content-
    addressed selection: each output is the smallest remaining input, found by comparing
    tokens with the previous output. Needs vocab_size >= 2."""
    return _then_separator(key, length, vocab_size, jnp.sort)


register_task("recall", recall, params={"pairs": None})
for _sample in (induction, reversal, sorting):
    register_task(_sample.__name__, _sample)
