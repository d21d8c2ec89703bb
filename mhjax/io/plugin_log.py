"""JAX's plugin errors off the console.

With ``jax[cuda13]`` installed on a machine without a GPU (to compile for one: ``--target``),
every start of a JAX backend logs a ~19-line "Jax plugin configuration error ... Unable to
load cuPTI" traceback (jax/_src/xla_bridge.py) and goes on with the CPU. It says nothing a
CPU user can act on and would break the one-line error promise, so the record is held here
and written to the workdir's mhjax.log (commands/train.py's library_logs) instead.
"""

from __future__ import annotations

import logging

LOGGER = "jax._src.xla_bridge"
PREFIX = "Jax plugin configuration error"


class _Hold(logging.Filter):
    def __init__(self):
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if str(record.msg).startswith(PREFIX):
            self.records.append(record)
            return False
        return True


_hold = _Hold()


def hold() -> None:
    """From now on, keep JAX's plugin configuration errors off the console (idempotent)."""
    logger = logging.getLogger(LOGGER)
    if _hold not in logger.filters:
        logger.addFilter(_hold)


def held() -> list[logging.LogRecord]:
    """The records held so far (for mhjax.log)."""
    return list(_hold.records)
