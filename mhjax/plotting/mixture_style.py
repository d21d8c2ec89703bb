"""What every figure of a mixture sweep shares (plotting/mixture.py, mixture_geometry.py,
mixture_init.py): the title (init scheme, loss, diverged members left out), the S_k clock of the rate
figures, a colour per head count, log axes that read at a glance, and a member's TensorBoard curves."""

from __future__ import annotations

import numpy as np

from mhjax.io.workdir import Workdir
from mhjax.models import mixture_parts


class NothingToDraw(Exception):
    """The records hold no data for this figure (it is left out without a message)."""


class Style:
    """What every panel says: the init scheme, the loss, whether it has an exponential tail, and
    the step rule whose S_k = sum_{j<k} eta_j is the clock of the rate figures."""

    def __init__(
        self, init: str = "?", loss: str = "logistic", tail: bool = True, step_rule: str = "constant", left_out=()
    ):
        self.init, self.loss, self.tail, self.step_rule = init, loss, tail, step_rule
        self.left_out = list(left_out)  # the diverged members, left out of every figure

    def clock(self, eta: float, steps):
        """S_k at ``steps`` for step size ``eta`` (models/mixture_parts.step_sums)."""
        return mixture_parts.step_sums(mixture_parts.get("step_rule", self.step_rule).fn, eta, steps)

    def suptitle(self, fig, what: str) -> None:
        note = "" if self.tail else " (no exponential tail: 1/S_K and c/(gamma^2 n) left out)"
        if self.left_out:
            named = ", ".join(self.left_out[:3]) + (
                f" and {len(self.left_out) - 3} more" if len(self.left_out) > 3 else ""
            )
            note += f"\n{len(self.left_out)} diverged member(s) left out: {named}"
        fig.suptitle(f"{what}; init={self.init}, loss={self.loss}{note}", fontsize=10)


def member_curves(workdir: Workdir, name: str, tags) -> dict:
    """A member's TensorBoard curves ({} when it has no TensorBoard run)."""
    return workdir.curves(name, tags) if workdir.has_curves(name) else {}


def head_colours(heads):
    """{H: colour} along viridis, head counts in order."""
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    heads = sorted(set(heads))
    return {h: cmap(i / max(len(heads) - 1, 1)) for i, h in enumerate(heads)}


def log_axes(ax, x: bool = True, y: bool = True, base: float = 10) -> None:
    """Log scale on ``x`` / ``y`` with major tick labels only."""
    from matplotlib.ticker import NullFormatter

    for flag, scale, axis in ((x, ax.set_xscale, ax.xaxis), (y, ax.set_yscale, ax.yaxis)):
        if flag:
            scale("log", base=base)
            axis.set_minor_formatter(NullFormatter())


def readable_ticks(ax, x: bool = True, y: bool = True) -> None:
    """Tick labels on a log axis of ``ax`` whose range holds one power of 10 or none (a log
    locator would label one tick or none): about four evenly spaced ticks, written plainly."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator, NullFormatter

    for flag, axis, scale, limits in (
        (x, ax.xaxis, ax.get_xscale(), ax.get_xlim()),
        (y, ax.yaxis, ax.get_yscale(), ax.get_ylim()),
    ):
        low, high = sorted(limits)
        if not flag or scale != "log" or low <= 0 or np.floor(np.log10(high)) - np.ceil(np.log10(low)) >= 1:
            continue
        axis.set_major_locator(MaxNLocator(nbins=4))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:.3g}"))
        axis.set_minor_formatter(NullFormatter())
