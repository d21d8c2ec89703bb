"""A compiled program's matmul FLOPs counted from its optimised HLO text, every loop body
once per trip: the count XLA's cost analysis does not give on a TPU.

Measured with libtpu's compile-only v5e devices (jax 0.10.2, tests/test_target_devices.py):
the TPU compiler's ``cost_analysis()`` is one device's program (the member axis split over
the chips: one chip's members) and counts every while body ONCE, whatever its trip count:
the chunk's loop over steps (a 1-, 2- and 4-step chunk report the same FLOPs and bytes, so
no difference of two chunks calibrates it) and also the scanned layers' loops inside a step
(model.scan_layers, on by default on a TPU): with L layers scanned it counts one layer's
forward and backward, not L. The paper model's 2.09 GFLOP "per member-step" was that: one
member's step with one of its 4 layers.

Here every dot and convolution (inside fusions too) is charged 2 x its output elements x its
contraction length (a convolution's window taps that meet its input dilation's holes left
out: XLA writes a matmul batched over vmapped members as such a convolution), and every
Pallas TPU (Mosaic) call its own cost estimate's FLOPs, each times the runs of its
computation: a loop body per trip (XLA's known trip count where the HLO states it, else the
constant its condition compares the counter with), a conditional's branches each once per
the branches' count (the average device, where a switch on the device index runs one group
per device). Elementwise work is not counted (models/flops.py counts matmuls too).
"""

from __future__ import annotations

import math
import re

from mhjax.train import hlo

DIMS = re.compile(r"\[([0-9,]*)\]")
CONTRACTING = re.compile(r"lhs_contracting_dims=\{([0-9,]*)\}")
LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
WINDOW = re.compile(r"window=\{([^}]*)\}")
COST = re.compile(r'"cost_estimate":\{"flops":"(\d+)"')


def _dims(type_text: str) -> list[int]:
    found = DIMS.search(type_text)
    return [int(d) for d in found.group(1).split(",") if d] if found else []


def runs(comps: dict[str, list[str]], entry: str) -> dict[str, float]:
    """{computation: runs per run of the program}, fused computations and branches included."""
    return hlo.runs(comps, entry, inside=True)


def _instruction_flops(line: str, rhs: str, types: dict[str, str]) -> float:
    match = hlo.INSTRUCTION.match(rhs)
    if not match:
        return 0.0
    out_type, op, args = match.groups()
    names = [a.strip().split()[-1] for a in args.split(",") if a.strip()]
    if op == "custom-call" and "tpu_custom_call" in line:
        cost = COST.search(line)
        return float(cost.group(1)) if cost else 0.0
    if op not in ("dot", "convolution") or len(names) < 2:
        return 0.0
    lhs, rhs_dims = _dims(types.get(names[0], "")), _dims(types.get(names[1], ""))
    outputs = math.prod(_dims(out_type))
    if op == "dot":
        contracting = CONTRACTING.search(line)
        axes = [int(a) for a in contracting.group(1).split(",") if a] if contracting else []
        return 2.0 * outputs * math.prod(lhs[a] for a in axes if a < len(lhs))
    labels = LABELS.search(line)
    if not labels or not rhs_dims:
        return 0.0
    kernel = labels.group(2)  # rhs labels: i input features, o output features, digits the window
    out_features = rhs_dims[kernel.index("o")] if "o" in kernel and len(kernel) == len(rhs_dims) else 1
    return 2.0 * outputs * math.prod(rhs_dims) / max(out_features, 1) / _dilation_holes(line)


def _dilation_holes(line: str) -> float:
    """How many of a convolution's window taps per output fall into its input dilation's holes,
    as a factor: XLA writes a batched matmul over vmapped members as a window over the member
    axis (size M, lhs_dilate M), of which one tap meets a member (M x the useful FLOPs)."""
    window = WINDOW.search(line)
    if not window:
        return 1.0
    fields = dict(part.split("=", 1) for part in window.group(1).split() if "=" in part)
    sizes = [int(x) for x in fields.get("size", "").split("x") if x]
    dilates = [int(x) for x in fields.get("lhs_dilate", "").split("x") if x] or [1] * len(sizes)
    return math.prod(size / math.ceil(size / dilate) for size, dilate in zip(sizes, dilates))


def matmul_flops(text: str) -> float:
    """FLOPs of one run of the compiled program (the module ``text``): its matmuls and Pallas
    TPU calls, loops counted per trip (see the module's docstring)."""
    comps, entry = hlo.computations(text)
    total = 0.0
    for name, count in runs(comps, entry).items():
        types = {}
        for line in comps[name]:
            result, rhs = line.split(" = ", 1)
            match = hlo.INSTRUCTION.match(rhs)
            if match:
                types[result.strip()] = match.group(1)
            total += count * _instruction_flops(line, rhs, types)
    return total
