"""The API's boundary: a message of the code the command line shares (workflows/, config), said in
Python's words: flags as the keyword arguments that set them, commands as the calls that do the same.
``python_errors`` puts it on the entry points and on ``Run``'s methods."""

from __future__ import annotations

import functools
import re

from mhjax.config import ConfigError

# Flags whose Python argument is not the flag's name in snake case.
PYTHON_ARGUMENTS = {
    "--exclude-sink": "include_sink=False",
    "--no-tensorboard": "tensorboard=False",
    "--no-plot": "plot=False",
    "--no-ablation": "ablate=False",
    "--allow-changed-task": "allow_changed_task=True",
}


# Commands a shared message names, as the Python call that does the same.
PYTHON_CALLS = (
    (re.compile(r"mhjax analyze --workdir [^\s`)]+"), "run.analyze()"),
    (re.compile(r"mhjax train --config \.\.\. --workdir ([^\s`)]+)"), r"mhjax.sweep(config, '\1')"),
)
FLAG = re.compile(r"(?<![\w.-])--[a-z][a-z-]*")


def _argument(flag: str) -> str:
    return PYTHON_ARGUMENTS.get(flag, flag[2:].replace("-", "_"))


def python_wording(message: str) -> str:
    """A message of the code the command line shares in Python's words: its leading flag named as
    the Python argument (``--num-sequences: ...`` -> ``num_sequences: ...``), a command it names
    as the call (``mhjax analyze --workdir W`` -> ``run.analyze()``), any other flag as its
    argument (``leave out --sequences`` -> ``leave out sequences``)."""
    head, sep, rest = message.partition(": ")
    if not (sep and re.fullmatch(r"--[a-z][a-z-]*(/--[a-z][a-z-]*)*", head)):
        head, sep, rest = "", "", message
    head = "/".join(_argument(flag) for flag in head.split("/")) if head else ""
    for pattern, call in PYTHON_CALLS:
        rest = pattern.sub(call, rest)
    return head + sep + FLAG.sub(lambda m: _argument(m.group(0)), rest)


def python_errors(fn):
    """``fn`` whose ConfigErrors name Python arguments, not flags (the API boundary)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            raise ConfigError(python_wording(str(exc))) from exc.__cause__

    return wrapper
