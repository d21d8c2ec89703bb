"""How to add a task: one pure function of a PRNG key, registered by name (README: "Your own task").

sample(key, length, vocab_size) -> (inputs, targets, weights), each of shape (length,):
int32 tokens, int32 targets (what the causal model outputs at each position) and float32
weights (which positions count in the loss and the accuracy)."""

import jax
import jax.numpy as jnp

import mhjax


@mhjax.task("first_token")
def first_token(key, length, vocab_size):
    """Every position after the first outputs the sequence's first token (a head that looks back to 0)."""
    inputs = jax.random.randint(key, (length,), 0, vocab_size, dtype=jnp.int32)
    targets = jnp.full((length,), inputs[0], jnp.int32)
    weights = jnp.ones((length,), jnp.float32).at[0].set(0.0)  # position 0 only copies: it does not count
    return inputs, targets, weights


def previous(tokens):
    """targets(tokens): tokens (..., T) -> the token one position back (position 0: itself)."""
    return jnp.concatenate([tokens[..., :1], tokens[..., :-1]], axis=-1)


@mhjax.task("previous_token", targets=previous)
def previous_token(key, length, vocab_size):
    """Every position outputs the token before it (a head that looks back one position); with
    ``targets=previous``, run.forward scores any tokens and `mhjax analyze --sequences` reads them."""
    inputs = jax.random.randint(key, (length,), 0, vocab_size, dtype=jnp.int32)
    return inputs, previous(inputs), jnp.ones((length,), jnp.float32)
