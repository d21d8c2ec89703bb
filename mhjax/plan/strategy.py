"""``strategy=auto`` resolved: how the members are laid out in programs on a backend.

On a CPU: unrolled for long runs of few members on one device, else fused. Paper model on 2
cores (benchmarks/RESULTS.md): unrolled steps 12-20 % faster than fused, but compiles ~20 s
longer per member; a short run would lose the difference. Elsewhere: the strategy the cost
model (models/cost.py) predicts fastest among those whose JAX path would fit (plan/memory.py);
over several devices each device runs its shard of one_program's groups
(models/member_layout.py). Ties go to the fewest programs (fused, then one_program, then grouped).
"""

from __future__ import annotations

from mhjax.plan import memory

STRATEGIES = ("auto", "unrolled", "fused", "grouped", "one_program")  # how the trainer may lay out a sweep
CANDIDATES = ("fused", "one_program", "grouped")  # auto's on an accelerator, the fewest programs first
UNROLL_MIN_STEPS, UNROLL_MAX_MEMBERS = 2000, 16  # when `auto` unrolls on a CPU


def auto(plan, devices: int) -> str:
    """The strategy ``auto`` takes for ``plan``'s sweep (its shapes, backend and attention) over
    ``devices``; ``plan.rate(strategy, devices)``: the cost model's member-steps/s."""
    shapes, steps = plan.shapes, plan.steps
    if plan.backend == "cpu":
        long_run = steps >= UNROLL_MIN_STEPS and len(shapes.heads) <= UNROLL_MAX_MEMBERS
        return "unrolled" if long_run and devices == 1 else "fused"
    choice = plan.attention  # a strategy whose JAX path would not fit is no candidate
    fitting = [s for s in CANDIDATES if memory.fits(shapes, choice, choice.core(shapes.traced(s)), devices)]
    candidates = tuple(fitting) or CANDIDATES  # none fits: the layout says so in one line
    rate = {s: plan.predict(s, devices=devices)["member_steps_per_s"] for s in candidates}
    return max(candidates, key=rate.__getitem__)  # max keeps the first of equals
