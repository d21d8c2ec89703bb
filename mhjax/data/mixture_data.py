"""Mixture data generators as plug-ins: ``sample(key, data) -> (x, y)`` draws ONE example.

x is (T, d) float32 with T = data.seq_len and d = data.dim, y a float32 scalar in {-1, +1};
``data`` is a read-only view of config.data (a ``DataView``: attributes and ``data["field"]``),
which may hold extra fields for the plug-in. Register one with ``@mhjax.mixture_data("name")``
(or ``register_mixture_data``) in a config file or a module it imports, and select it with
``config.data.generator``. The built-in "tokenized_mixture" (data/mixture.py) is the default; it
alone validates the cluster fields.

Example i of a stream is ``sample(fold_in(key, i), data)``, so a smaller set is a prefix of a
larger one. The host draws examples SAMPLE_BLOCK at a time, vmapped, with one compiled program
per generator and data view (``HostSampler``). Before anything compiles, ``check_generator``
runs the sample on a few keys: shapes and dtypes, labels, finite values, a function of its key,
draws that change with the key. The host sampler then checks the label of every example it
draws (``check_labels``: a numpy comparison, one pass over y).
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.config import ConfigError
from mhjax.data.mixture import DATA_FIELDS, sample_mixture, validate_mixture_config
from mhjax.data.plugins import Registry, one_line

DEFAULT_GENERATOR = "tokenized_mixture"
GENERATORS = Registry("mixture data")
SAMPLE_BLOCK = 64  # examples per call of the host sampler (one compiled program for any count)


def register_mixture_data(name: str, sample, *, validate=None, fields=None):
    """Register ``sample(key, data) -> (x, y)`` under ``name``. ``validate(data)`` (optional)
    raises ValueError("<field>: ...") on a bad data field; ``fields``: the only data fields the
    generator accepts (None: any extra field)."""
    return GENERATORS.register(name, sample, validate=validate, fields=fields)


def mixture_data(name: str, *, validate=None, fields=None):
    """Decorator: ``@mhjax.mixture_data("name")`` above ``def sample(key, data)``."""

    def register(sample):
        register_mixture_data(name, sample, validate=validate, fields=fields)
        return sample

    return register


@mixture_data("tokenized_mixture", validate=validate_mixture_config, fields=DATA_FIELDS)
def tokenized_mixture(key, data):
    """The tokenized mixture of arXiv 2310.12680 (data/mixture.py), one example."""
    x, y = sample_mixture(key, data, 1)
    return x[0], y[0]


def _freeze(value):
    if isinstance(value, Mapping):
        return DataView(value)
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


class DataView:
    """A read-only, hashable view of config.data: ``data.dim`` or ``data["dim"]`` (hashable, so a
    compiled sampler is kept per data view)."""

    def __init__(self, fields: Mapping):
        items = tuple(sorted((str(k), _freeze(v)) for k, v in dict(fields).items()))
        object.__setattr__(self, "_items", items)
        for name, value in items:
            object.__setattr__(self, name, value)

    def __getitem__(self, key):
        return dict(self._items)[key]

    def __contains__(self, key) -> bool:
        return key in dict(self._items)

    def __iter__(self):
        return (name for name, _ in self._items)

    def __setattr__(self, name, value):
        raise AttributeError("the data view is read-only")

    def __hash__(self):
        return hash(self._items)

    def __eq__(self, other):
        return isinstance(other, DataView) and self._items == other._items

    def __repr__(self):
        return "DataView(" + ", ".join(f"{k}={v!r}" for k, v in self._items) + ")"


def data_view(data_config) -> DataView:
    """config.data as the view a generator sees (``num_test`` and ``generator`` included)."""
    items = data_config.to_dict() if hasattr(data_config, "to_dict") else dict(data_config)
    return DataView(items)


def generator_name(data_config) -> str:
    return data_config.get("generator", DEFAULT_GENERATOR) if hasattr(data_config, "get") else DEFAULT_GENERATOR


# --------------------------------------------------------------------------- #
# Checks run before anything compiles
# --------------------------------------------------------------------------- #
_CHECKED: set = set()


def check_generator(name, data: DataView, field: str = "config.data.generator"):
    """The registered generator ``name`` after checking its sample on a few keys; ConfigError
    naming ``field`` otherwise. Memoised per (generator, data view)."""
    gen = GENERATORS.get(name, field)
    memo = (name, gen.identity(), data)
    if memo in _CHECKED:
        return gen
    where = f"{field}: mixture data {name!r} ({gen.label()})"
    t, d = int(data.seq_len), int(data.dim)
    want = f"(x, y) with x ({t}, {d}) float32 and y () float32"
    key = jax.random.PRNGKey(0)
    try:
        shapes = jax.eval_shape(lambda k: gen.fn(k, data), key)
    except Exception as exc:
        raise ConfigError(f"{where}: sample(key, data) failed: {one_line(exc)}") from None
    got = None
    if isinstance(shapes, (tuple, list)) and len(shapes) == 2:
        got = [(tuple(getattr(a, "shape", ())), str(getattr(a, "dtype", type(a).__name__))) for a in shapes]
    if got != [((t, d), "float32"), ((), "float32")]:
        described = ", ".join(f"{s} {dt}" for s, dt in got) if got else type(shapes).__name__
        raise ConfigError(f"{where}: sample must return {want}; got {described}")
    keys = [jax.random.fold_in(key, i) for i in range(4)]
    draws = [[np.asarray(a) for a in gen.fn(k, data)] for k in keys]
    again = [np.asarray(a) for a in gen.fn(keys[0], data)]
    if any(not np.array_equal(a, b) for a, b in zip(draws[0], again)):
        raise ConfigError(f"{where}: sample is not a function of its key (two calls with one key differ)")
    for x, y in draws:
        if not np.all(np.isfinite(x)):
            raise ConfigError(f"{where}: x must be finite; got non-finite values")
        if float(y) not in (-1.0, 1.0):
            raise ConfigError(f"{where}: y must be -1 or +1; got {float(y)!r}")
    if all(np.array_equal(draws[0][0], x) for x, _ in draws[1:]):
        raise ConfigError(f"{where}: every key gives the same x: the draws do not change with the key")
    _CHECKED.add(memo)
    return gen


# --------------------------------------------------------------------------- #
# Example streams: example i of a key is drawn from fold_in(key, i)
# --------------------------------------------------------------------------- #
def sample_examples(sample, key, data, count: int, start=0):
    """Examples start..start+count-1 of the stream of ``key``: example i is sample(fold_in(key,
    i), data), so it does not depend on ``count``. Returns (X (count, T, d), y (count,))."""
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(start + jnp.arange(count, dtype=jnp.uint32))
    return jax.vmap(lambda k: sample(k, data))(keys)


@partial(jax.jit, static_argnames=("sample", "data"))
def _sample_block(key, start, sample, data):
    return sample_examples(sample, key, data, SAMPLE_BLOCK, start)


def check_labels(y, plugin, split: str, field: str = "config.data.generator") -> None:
    """ConfigError naming the generator, the split and the first example whose label is not -1
    or +1 (check_generator sees a few draws; a generator wrong on 1 example in 20 passes it)."""
    y = np.asarray(y)
    bad = np.flatnonzero((y != 1.0) & (y != -1.0))
    if bad.size:
        i = int(bad[0])
        raise ConfigError(
            f"{field}: mixture data {plugin.name!r} ({plugin.label()}): y must be -1 or +1; {split} example {i} "
            f"has y = {float(y[i])!r} ({bad.size} of {y.size} {split} examples are bad)"
        )


class HostSampler:
    """``sample_examples`` on the host, compiled once per generator, data view and process for a
    block of SAMPLE_BLOCK examples and called block after block (the sampler's compile takes
    seconds on CPU, so neither the count nor a new experiment object may trigger another).
    Every label drawn is checked (``check_labels``)."""

    def __init__(self, data_config):
        self.data = data_view(data_config)
        self.plugin = GENERATORS.get(generator_name(data_config), "config.data.generator")
        self.sample = self.plugin.fn

    def __call__(self, key, count: int, split: str = "training"):
        blocks = [
            jax.device_get(_sample_block(jnp.asarray(key), jnp.uint32(b * SAMPLE_BLOCK), self.sample, self.data))
            for b in range(-(-count // SAMPLE_BLOCK))
        ]
        X = np.concatenate([b[0] for b in blocks])[:count]
        y = np.concatenate([b[1] for b in blocks])[:count]
        check_labels(y, self.plugin, split)
        return X, y
