"""The check a task passes before anything compiles: shapes and dtypes, tokens in range, a
function of its key (the same key gives the same draw, other keys another one), some positive
weight. Every failure is a one-line ConfigError; an exception raised in the task's own code
names the user's file and line (``MHJAX_TRACEBACK=1`` keeps its traceback)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.config import ConfigError, chained, user_error
from mhjax.data.tasks import Task, _identity, get_task

_CHECKED: set[tuple] = set()  # (name, identity, params, length, vocab) that passed check_task
KEYS = (0, 1, 2)  # the PRNGKey seeds the check draws from


def check_task(
    name: str, length: int, vocab_size: int, field: str = "config.sweep.task", params: dict | None = None
) -> Task:
    """The registered task ``name`` with ``params`` bound, after checking its forms on a few
    keys. Raises ConfigError."""
    t = get_task(name, field).with_params(params)
    # the targets form too: a notebook that registers the same sampler with another one is checked again
    memo = (name, _identity(t), t.targets, tuple(sorted(t.kwargs.items(), key=lambda kv: kv[0])), length, vocab_size)
    if memo in _CHECKED:
        return t
    where = f"{field}: task {name!r} ({t.label()})"
    want = f"(inputs, targets, weights) of shape ({length},), dtypes int32, int32, float32"
    key = jax.random.PRNGKey(0)
    shapes = _run(
        where,
        f"sample(key, {length}, {vocab_size})",
        lambda: jax.eval_shape(lambda k: t.call_sample(k, length, vocab_size), key),
    )
    _check_shapes(where, "sample", shapes, (length,), want)
    if t.batch is not None:
        call = f"batch(key, 3, {length}, {vocab_size})"
        shapes = _run(where, call, lambda: jax.eval_shape(lambda k: t.draw(k, 3, length, vocab_size), key))
        _check_shapes(where, "batch", shapes, (3, length), want.replace(f"({length},)", f"(3, {length})"))

    def draw(seed):
        out = t.call_sample(jax.random.PRNGKey(seed), length, vocab_size)
        return [np.asarray(a) for a in out]

    first = _run(where, "sample", lambda: draw(0))
    again = draw(0)
    if any(not np.array_equal(a, b) for a, b in zip(first, again)):
        raise ConfigError(f"{where}: sample is not a function of its key (two calls with one key differ)")
    draws = [first] + [draw(s) for s in KEYS[1:]]
    if all(all(np.array_equal(a, b) for a, b in zip(first, d)) for d in draws[1:]):
        raise ConfigError(
            f"{where}: sample ignores its key (the draws for keys {', '.join(map(str, KEYS))} are all equal): "
            "every training and held-out sequence would be the same one; draw from the key"
        )
    if t.batch is not None:
        rows = [[np.asarray(a) for a in t.draw(jax.random.PRNGKey(s), 3, length, vocab_size)] for s in KEYS[:2]]
        if all(np.array_equal(a, b) for a, b in zip(*rows)):
            raise ConfigError(f"{where}: batch ignores its key (the draws for keys 0 and 1 are equal); draw from it")
    for inputs, targets, weights in draws:
        for label, tokens in (("inputs", inputs), ("targets", targets)):
            if tokens.min() < 0 or tokens.max() >= vocab_size:
                raise ConfigError(
                    f"{where}: {label} must be tokens in [0, {vocab_size - 1}], "
                    f"got values in [{tokens.min()}, {tokens.max()}]"
                )
        if not np.all(np.isfinite(weights)) or weights.min() < 0:
            raise ConfigError(f"{where}: weights must be finite and >= 0")
    if all(not np.any(w > 0) for _, _, w in draws):
        raise ConfigError(f"{where}: weights are all zero: no position counts in the loss")
    if t.targets is not None:
        _check_targets_form(t, where, np.stack([d[0] for d in draws[:2]]))
    _CHECKED.add(memo)
    return t


def _check_targets_form(t, where: str, tokens) -> None:
    """targets(tokens) on two drawn sequences (2, T): int32 targets of their shape, or (targets,
    weights) with float weights of that shape, finite and >= 0."""
    shape = tokens.shape
    want = f"int32 targets of the tokens' shape {shape}, or (targets, weights) with float32 weights of that shape"
    out = _run(where, "targets(tokens)", lambda: jax.eval_shape(t.call_targets, jax.ShapeDtypeStruct(shape, jnp.int32)))
    pair = isinstance(out, (tuple, list)) and len(out) == 2
    targets, weights = out if pair else (out, None)
    if getattr(targets, "shape", None) != shape or targets.dtype != jnp.int32:
        raise ConfigError(f"{where}: targets(tokens) must return {want}")
    if pair and (getattr(weights, "shape", None) != shape or not jnp.issubdtype(weights.dtype, jnp.floating)):
        raise ConfigError(f"{where}: targets(tokens) must return {want}")
    if pair:
        values = np.asarray(_run(where, "targets(tokens)", lambda: t.targets_and_weights(jnp.asarray(tokens))[1]))
        if not np.all(np.isfinite(values)) or values.min() < 0:
            raise ConfigError(f"{where}: targets(tokens): weights must be finite and >= 0")


def _run(where: str, call: str, fn):
    """fn(); an exception from the task's code -> one line naming it and the user's file and line."""
    try:
        return fn()
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(f"{where}: {call} failed: {user_error(exc)}") from chained(exc)


def _check_shapes(where: str, form: str, shapes, shape: tuple, want: str) -> None:
    ok = isinstance(shapes, (tuple, list)) and len(shapes) == 3
    got = None
    if ok:
        got = [(tuple(getattr(a, "shape", ())), str(getattr(a, "dtype", type(a).__name__))) for a in shapes]
        ok = got == [(shape, "int32"), (shape, "int32"), (shape, "float32")]
    if not ok:
        described = ", ".join(f"{s} {d}" for s, d in got) if got else type(shapes).__name__
        raise ConfigError(f"{where}: {form} must return {want}; got {described}")
