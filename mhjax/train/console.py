"""What `mhjax train` prints: the compile line, progress (a bar on a terminal, else one line
per chunk), the closing line, a table of the final results over the experiment's own
swept fields, and the commands to run next.

Everything but the table and the next commands goes to ``log`` (stderr in the CLI); while a
bar is drawn, lines are written above it so the bar is never glued to text nor drawn twice.
"""

from __future__ import annotations

import math
import os
import shlex
import sys
from typing import NamedTuple

from tqdm import tqdm

from mhjax.io.results import NONE_IS_A_VALUE, number_text, params_text


class Column(NamedTuple):
    title: str
    key: str  # results.json member field
    percent: bool = False  # a fraction shown as a percentage
    fmt: str = "{:.4f}"  # how a mean is written otherwise (results.number_text)


class SummaryTable(NamedTuple):
    """An experiment's end-of-training table: one row per combination of ``fields`` (swept
    fields, e.g. task, task_params and heads), each column the mean over that row's members
    (seeds). A field whose value is a dict (``task_params``) reads ``cap=2``."""

    fields: tuple[str, ...]
    columns: tuple[Column, ...]


def terminal_width(stream) -> int:
    """Columns of the terminal ``stream`` writes to; 0 when it is not a terminal or reports no
    size (tqdm draws nothing on a terminal with 0 rows, e.g. some CI and `script` sessions)."""
    try:
        size = os.get_terminal_size(stream.fileno()) if stream.isatty() else None
    except (AttributeError, OSError, ValueError):
        return 0
    return size.columns if size and size.columns and size.lines else 0


class Console:
    """``progress``: show progress at all (``--no-progress`` turns it off). On a terminal
    with a width, a tqdm bar; elsewhere (logs, pipes, CI) one plain line per chunk."""

    def __init__(self, log=print, progress: bool = True, stream=None):
        self._log, self._progress = log, progress
        self._stream = stream or sys.stderr
        self._bar = None
        self._total = 0

    def log(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message, file=self._stream)
        else:
            self._log(message)

    def compiling(self, what: str) -> None:
        self.log(f"compiling {what} ...")

    def compiled(self, seconds: float, executables: int, from_cache: int) -> None:
        cached = f", {from_cache} of {executables} loaded from the compile cache" if from_cache else ""
        self.log(f"compiled in {seconds:.1f} s{cached}")

    def start(self, total: int, initial: int) -> None:
        """Progress from ``initial`` to ``total`` steps (nothing when there is nothing to train)."""
        self._total = total
        if self._progress and initial < total and terminal_width(self._stream):
            self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=self._stream)

    def advance(self, steps: int, step: int, rate: float, seconds: float) -> None:
        """``steps`` more done, now at ``step``; ``rate`` member-steps/s of the chunk."""
        if self._bar is not None:
            self._bar.set_postfix_str(f"{rate:,.0f} member-steps/s", refresh=False)
            self._bar.update(steps)
        elif self._progress:
            percent = 100 * step / max(self._total, 1)
            self._log(f"step {step}/{self._total} ({percent:.0f}%): {rate:,.0f} member-steps/s, {seconds:.0f} s")

    def close(self) -> None:
        """End the bar's line, so what follows starts on a line of its own."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def throughput_text(throughput: dict) -> str:
    """The closing line's ", 1,234 tokens/s, MFU 12.3%": what the experiment derives from
    member-steps/s (Experiment.throughput); "" when it derives nothing."""
    text = f", {throughput['tokens_per_s']:,.0f} tokens/s" if throughput.get("tokens_per_s") is not None else ""
    if "mfu" in throughput:
        text += ", MFU " + (
            "n/a (no peak for this device)" if throughput["mfu"] is None else f"{throughput['mfu']:.1%}"
        )
    return text


def _mean(values: list[float]) -> float:
    finite = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def summary_lines(table: SummaryTable | None, records: list[dict]) -> list[str]:
    """The table's text: a header and one row per combination of ``table.fields``, in the
    order the members come; mean over the row's members whose training did not diverge
    (``members`` counts those, with the diverged ones left out in brackets; none left: "-")."""
    if table is None or not records:
        return []
    rows: dict[tuple, list[dict]] = {}
    for record in records:
        rows.setdefault(tuple(_key_text(record.get(f), f) for f in table.fields), []).append(record)
    header = [*table.fields, "members", *(c.title for c in table.columns)]
    body = []
    for values, members in rows.items():
        ok = [r for r in members if r.get("status", "ok") == "ok"]
        left_out = len(members) - len(ok)
        cells = [*values, f"{len(ok)}" + (f" (+{left_out} diverged)" if left_out else "")]
        for column in table.columns:
            mean = _mean([r.get(column.key, float("nan")) for r in ok])
            if not math.isfinite(mean):
                cells.append("-")
            else:
                cells.append(
                    number_text(100 * mean, "{:.2f}") + "%" if column.percent else number_text(mean, column.fmt)
                )
        body.append(cells)
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header))]
    key_count = len(table.fields)

    def line(cells):
        return "  ".join(c.ljust(w) if i < key_count else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    return [line(header)] + [line(row) for row in body]


def _key_text(value, field: str = "") -> str:
    if value is None and field in NONE_IS_A_VALUE:  # head_dim None: parameter matching, as results.md
        return "None"
    return params_text(value) if isinstance(value, dict) or value is None else str(value)


def next_commands(workdir: str, tensorboard_dir: str, analyzable: bool) -> list[str]:
    """The commands that apply to a trained workdir, with its actual paths."""
    quoted = shlex.quote(workdir)
    commands = [f"mhjax analyze --workdir {quoted}"] if analyzable else []
    return commands + [f"mhjax report --workdir {quoted}", f"tensorboard --logdir {shlex.quote(tensorboard_dir)}"]
