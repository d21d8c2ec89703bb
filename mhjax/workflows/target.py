"""Compiling a sweep for a GPU that is not here (``mhjax train --dry-run --target``,
``mhjax.compile_for``): know that a sweep compiles and fits before paying for GPU time."""

from __future__ import annotations

from mhjax.experiments import make_experiment
from mhjax.train import deviceless
from mhjax.train import target as targets


def compile_for(config, target: str, log=print, describe=None) -> deviceless.Report:
    """Compile every executable of ``config``'s sweep for ``target`` (a bundled name: h200,
    h100, a100, NAMExN for N of them, or a GpuTargetConfig text file) on this machine; ``log`` gets progress lines,
    ``describe`` (if given) the sweep's plan for the target before the compiles start. Needs
    the GPU compiler (jax[cuda13] at the installed jax version); without it, a ConfigError
    naming the install command."""
    chosen = targets.load(target)
    targets.devices(chosen)  # a missing compiler: one line, before anything else
    experiment = make_experiment(config)
    if describe is not None:  # the plan described is the one compiled (deviceless: Sweep.plan)
        describe("\n".join(experiment.plan(chosen.backend, chosen.count, planned=True).lines()))
    return deviceless.compile_for(experiment, chosen, log=log)


def report_lines(report: deviceless.Report) -> list[str]:
    return deviceless.lines(report)
