"""An independent count of a compiled TPU program's HBM traffic, for checking train/hlo.py's
bytes line against (tests/test_tpu_bytes.py): its own parse of the HLO text, rules stated
from what the hardware moves, and no use of a kernel's stated bytes. Only the loop trip
counts come from train/hlo.py (hlo.runs).

Every top-level instruction (loop bodies once per trip) reads its operands and writes its
results where they lie in HBM (a value in VMEM, layout S(1), moves nothing); an async copy or
slice once, reading the bytes it copies; a fusion reads an operand it only dynamic-slices at the
slices, and a stack it updates in place (a dynamic-update-slice output) neither read nor written
whole, its update written; a buffer set aside (AllocateBuffer) moves nothing; a Pallas call
reads and writes its group's members of the member-axis arrays (the group: its row statistics'
leading dimension), the statistics and seeds whole, and not the aliased buffer it writes into."""

import re

from mhjax.train import hlo

TYPE = re.compile(r"\b(f32|bf16|s32|u32|pred|f16|s8|u8)\[([0-9,]*)\](\{[^}]*\})?")
SIZE = {"f32": 4, "bf16": 2, "s32": 4, "u32": 4, "pred": 1, "f16": 2, "s8": 1, "u8": 1}
FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call", "conditional"}
FREE |= {"after-all", "copy-done", "slice-done", "opt-barrier"}
LINE = re.compile(r"^(%[\w.\-]+) = (\(.*?\)|\S+) ([\w\-]+)\((.*?)\)")
ALIASED = re.compile(r"output_to_operand_aliasing=\{\{\d*\}: \((\d+),")


def arrays(type_text: str) -> list[tuple[int, int, bool]]:
    """[(leading dimension, bytes, in VMEM)] of a type's arrays, in order."""
    out = []
    for dtype, dims, layout in TYPE.findall(type_text):
        sizes = [int(d) for d in filter(None, dims.split(","))]
        n = 1
        for d in sizes:
            n *= d
        out.append((sizes[0] if sizes else 1, n * SIZE[dtype], "S(1)" in (layout or "")))
    return out


def hbm(type_text: str) -> int:
    return sum(size for _, size, vmem in arrays(type_text) if not vmem)


def _parse(lines):
    for line in lines:
        m = LINE.match(line)
        if m:
            result, rtype, op, args = m.groups()
            yield line, result, rtype, op, re.findall(r"%[\w.\-]+", args)


def _fusion(lines, names, types, rtype) -> int:
    parsed = {result: (op, rtype, args, line) for line, result, rtype, op, args in _parse(lines)}
    params = {
        r: int(line.split("parameter(", 1)[1].split(")")[0])
        for r, (op, _, _, line) in parsed.items()
        if op == "parameter"
    }
    uses = {}
    for op, t, args, _ in parsed.values():
        for position, a in enumerate(args):
            uses.setdefault(a, []).append((op == "dynamic-slice" and position == 0, hbm_all(t)))
    sliced = {params[p]: sum(b for _, b in u) for p, u in uses.items() if p in params and all(s for s, _ in u)}

    def through(name):
        while name in parsed and parsed[name][0] == "bitcast":
            name = parsed[name][2][0]
        return name

    root = next(reversed(parsed)) if parsed else None
    outputs = [through(a) for a in parsed[root][2]] if root and parsed[root][0] == "tuple" else [through(root)]
    in_place, written = set(), 0
    for o in outputs:
        op, t, args, _ = parsed.get(o, ("", "", [], ""))
        if op == "dynamic-update-slice" and through(args[0]) in params:
            in_place.add(params[through(args[0])])
            written += hbm_all(parsed[args[1]][1])
        else:
            written += hbm_all(t)
    if not in_place:
        written = hbm(rtype)
    return written + sum(0 if i in in_place else sliced.get(i, hbm(types.get(a, ""))) for i, a in enumerate(names))


def hbm_all(type_text: str) -> int:
    """Bytes of a value inside a fusion (no memory space there: its operand's or result's)."""
    return sum(size for _, size, _ in arrays(type_text))


def _pallas(line, rtype, names, types) -> int:
    results = arrays(rtype)
    members = results[0][0]
    aliased = ALIASED.search(line)
    skip = int(aliased.group(1)) if aliased else None
    operands = [arrays(types.get(a, ""))[0] if types.get(a) else (0, 0, True) for a in names]
    if len(results) > 1:  # forward: (out, statistics)
        group = results[1][0]
    else:  # backward: (seeds, q/k/v, q/k/v, dout, out, statistics[, into])
        group = operands[5][0]
    share = lambda lead, size: size * group / members if lead == members else size  # noqa: E731
    moved = sum(share(lead, size) for i, (lead, size, vmem) in enumerate(operands) if not vmem and i != skip)
    return moved + sum(share(lead, size) for lead, size, vmem in results if not vmem)


def count(text: str) -> tuple[float, float]:
    """(bytes besides the Pallas calls, the Pallas calls' bytes) of one run of the program."""
    comps, entry = hlo.computations(text)
    rest = kernels = 0.0
    for name, times in hlo.runs(comps, entry).items():
        types = {}
        for line, result, rtype, op, names in _parse(comps[name]):
            types[result] = rtype
            if op in FREE or "AllocateBuffer" in line:
                continue
            if op in ("copy-start", "slice-start"):  # ((source), destination, context): a slice reads its slice
                (_, dst, dst_vmem), source = arrays(rtype)[1], arrays(types.get(names[0], ""))
                src_vmem = not source or source[0][2]  # where the operand lies, as its own instruction says
                rest += times * ((0 if src_vmem else dst) + (0 if dst_vmem else dst))
            elif "tpu_custom_call" in line:
                kernels += times * _pallas(line, rtype, names, types)
            elif op == "fusion":
                called = re.search(r"calls=(%[\w.\-]+)", line).group(1)
                rest += times * _fusion(comps.get(called, []), names, types, rtype)
            else:
                rest += times * (sum(hbm(types.get(a, "")) for a in names) + hbm(rtype))
    return rest, kernels
