"""Figures and Markdown: every PNG and report table mhjax writes.

An experiment hands its figures' data over as ``FigureRequest``s (Experiment.figures); ``draw``
finds the plotting function each names in ``FIGURES`` and calls it, so experiments never import
plotting code.
"""

from __future__ import annotations

import importlib
import sys

# request name -> (module, function(workdir, **data))
FIGURES = {
    "mixture": ("mhjax.plotting.mixture", "write_figures_and_summary"),
    "mixture_init": ("mhjax.plotting.mixture_init", "write_init_comparison"),
}


def draw(workdir, request, log=None) -> list:
    """Draw ``request`` (a FigureRequest: ``name`` in FIGURES and its ``data``) into ``workdir``;
    returns what the plotting function returns. A failure is one message: figures must never
    cost a finished run."""
    log = log or (lambda m: print(m, file=sys.stderr))
    try:
        module, function = FIGURES[request.name]
        return getattr(importlib.import_module(module), function)(workdir, **request.data)
    except Exception as exc:
        log(f"figures {request.name!r} skipped ({type(exc).__name__}: {exc})")
        return []
