"""JAX's persistent compilation cache for `mhjax train` and `mhjax analyze`: a repeated or
resumed sweep loads its compiled programs from disk instead of compiling them again.

Where it lives:
- ``MHJAX_CACHE_DIR`` set and not empty: ``$MHJAX_CACHE_DIR/xla``;
- ``MHJAX_CACHE_DIR`` set to the empty string: no persistent cache at all;
- else, when JAX's own ``JAX_COMPILATION_CACHE_DIR`` is set: JAX's settings, untouched;
- else ``~/.cache/mhjax/xla`` (``$XDG_CACHE_HOME/mhjax/xla`` when that is set).

JAX writes a program to the cache only if its compile took at least
``jax_persistent_cache_min_compile_time_secs`` (default 1 s): mhjax lowers that to 0 so
that every program of a sweep is cached, the small ones of a CPU run included, unless
``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`` is set. The cache is trusted code: keep it
in a folder only you can write.
"""

from __future__ import annotations

import os

import jax

from mhjax.cache_dir import ENV, cache_root


def configure() -> str | None:
    """Switch the persistent compilation cache on (or off) for this process, as described
    above; call before the first compile. Returns the folder in use, or None when off."""
    chosen = os.environ.get(ENV)
    if chosen is None and os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return jax.config.jax_compilation_cache_dir if jax.config.jax_enable_compilation_cache else None
    if chosen == "":
        jax.config.update("jax_enable_compilation_cache", False)
        return None
    path = os.path.join(cache_root(), "xla")
    jax.config.update("jax_enable_compilation_cache", True)
    jax.config.update("jax_compilation_cache_dir", path)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return path


class CacheCounter:
    """How many compile requests JAX answered from the persistent cache (JAX's monitoring
    events), counted from ``start()``."""

    _listening = False
    _counts = {"/jax/compilation_cache/cache_hits": 0}

    @classmethod
    def _listen(cls, event: str, **kwargs) -> None:
        if event in cls._counts:
            cls._counts[event] += 1

    def start(self) -> CacheCounter:
        if not CacheCounter._listening:  # one listener per process, never removed
            jax.monitoring.register_event_listener(CacheCounter._listen)
            CacheCounter._listening = True
        self._start = dict(CacheCounter._counts)
        return self

    def _since(self, event: str) -> int:
        return CacheCounter._counts[event] - self._start[event]

    @property
    def hits(self) -> int:
        return self._since("/jax/compilation_cache/cache_hits")
