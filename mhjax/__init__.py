"""mhjax: sweeps over the number of attention heads in JAX.

The Python API (imported on first use, so ``import mhjax`` stays fast):
``load_config``, ``sweep`` (trains; ``mhjax.train`` is the trainer's subpackage), ``compile_for``
(compiles a sweep for a GPU that is not here), ``load``, ``Run``, ``Forward`` (what ``Run.forward``
returns), ``Sample`` (what ``Run.sample`` returns), ``ConfigError``, ``DivergedError``
(``sweep(..., fail_on_divergence=True)``), tasks as plug-ins: ``task``, ``register_task``, ``registered_tasks``, and the
mixture experiment's plug-ins: ``mixture_data``, ``register_mixture_data``, ``register_mixture``.
"""

__version__ = "0.1.0"

# Before any JAX backend starts: with jax[cuda13] installed and no GPU, JAX logs a cuPTI traceback
# at backend start; it goes to the workdir's mhjax.log, as under the CLI (io/plugin_log.py).
from mhjax.io import plugin_log as _plugin_log  # noqa: E402  (logging only: stays fast)

_plugin_log.hold()

# Before JAX registers its atexit hooks: a stop's measured exit includes their teardown (train/preempt.py).
from mhjax.io import exit_clock as _exit_clock  # noqa: E402,F401

_LAZY = {
    "load_config": ("mhjax.api", "load_config"),
    "sweep": ("mhjax.api", "sweep"),
    "compile_for": ("mhjax.api", "compile_for"),
    "load": ("mhjax.api", "load"),
    "Run": ("mhjax.api", "Run"),
    "Forward": ("mhjax.analysis.forward", "Forward"),
    "Sample": ("mhjax.workflows.sample", "Sample"),
    "ConfigError": ("mhjax.config", "ConfigError"),
    "DivergedError": ("mhjax.train.status", "DivergedError"),
    "task": ("mhjax.data.tasks", "task"),
    "register_task": ("mhjax.data.tasks", "register_task"),
    "registered_tasks": ("mhjax.data.tasks", "registered"),
    "mixture_data": ("mhjax.data.mixture_data", "mixture_data"),
    "register_mixture_data": ("mhjax.data.mixture_data", "register_mixture_data"),
    "register_mixture": ("mhjax.models.mixture_parts", "register_mixture"),
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'mhjax' has no attribute {name!r}")
    import importlib

    module, attribute = _LAZY[name]
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
