"""What a compiled program holds, read from its optimised HLO text (``compiled.as_text()``).

- ``kernel_bytes``: memory traffic as the kernels see it: every instruction of the entry
  computation and of the computations it calls as loop bodies or conditions (not the insides
  of fusions: a fusion moves its operands and its result once) is charged its result's bytes
  plus its operands' bytes, as XLA's HloCostAnalysis charges an op; a fusion whose outputs
  (its root, or its root tuple's elements, through bitcasts) are dynamic-update-slices of a
  parameter (in place), those updates' bytes written and the buffer not read, an operand
  a fusion reads only through dynamic-slices, those slices' bytes (a scan's stacked buffers),
  and a Pallas call that states its bytes (a cost estimate: mhjax's TPU kernel), those in the
  share of its operands' and results' bytes that lie in HBM (none where the TPU compiler keeps
  them all in VMEM: a value in VMEM moves nothing); an ``AllocateBuffer`` (a buffer set aside)
  moves nothing.
  Approximate (a fusion that reads a static slice of an operand is charged the whole
  operand). On a GPU target, where ``cost_analysis()`` is None, this is the only count there is.
- ``triton_kernels``: the Pallas/Triton kernels in the program, by name (``tpu_kernels``: the
  Pallas TPU, Mosaic, ones); ``kernel_members``:
  the leading dimension of their results (the members one call computes: members / N per
  device where the member axis is split over N).
- ``square_tensors``: values of any type (f32 scores and probabilities, pred dropout masks,
  u32 hash bits, bf16) whose last two dimensions are (T, T), i.e. attention maps that reached
  memory (the fused kernel keeps them on chip).
- ``collectives``: the cross-device operations (all-gather, all-reduce, ...), by kind: a
  sweep's members are independent, so a training program split over devices needs none.
"""

from __future__ import annotations

import re
from collections import Counter

DTYPE_BYTES = {"f32": 4, "s32": 4, "u32": 4, "pred": 1, "f16": 2, "bf16": 2, "s8": 1, "u8": 1, "s64": 8, "u64": 8}
SHAPE = re.compile(r"\b(" + "|".join(DTYPE_BYTES) + r")\[([0-9,]*)\](\{[^}]*\})?")
# A TPU layout's memory space 1 is VMEM (the compiler's memory-space assignment puts values
# there): a value held on chip moves no HBM bytes
ON_CHIP = "S(1)"
ASYNC = {"copy-start", "slice-start"}  # (the operand, the destination, a flag): charged the copy once
DONE = {"copy-done", "slice-done"}
FREE = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "call", "conditional", "after-all"}
BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
FUSED = re.compile(r"calls=(%[\w.\-]+)")
CALLED = re.compile(r"(?:body|condition|to_apply|true_computation|false_computation)=(%[\w.\-]+)")
INSTRUCTION = re.compile(r"(\([^=]*?\)|\S+)\s+([\w\-]+)\((.*?)\)")
TRITON = re.compile(r'custom_call_target="__gpu\$xla\.gpu\.triton".*?backend_config=\{.*?\bname = "([^"]*)"')


def type_bytes(type_text: str) -> int:
    """HBM bytes of an HLO type, a tuple's summed: "f32[8,64]{1,0}" -> 2048; a TPU value in
    VMEM (layout memory space S(1)): 0."""
    return sum(_bytes(dtype, dims) for dtype, dims, layout in SHAPE.findall(type_text) if ON_CHIP not in layout)


def _all_bytes(line: str) -> int:
    """An instruction's result bytes wherever it lies (VMEM too): the type before its op."""
    match = INSTRUCTION.match(line.split(" = ", 1)[1]) if " = " in line else None
    return sum(_bytes(dtype, dims) for dtype, dims, _ in SHAPE.findall(match.group(1))) if match else 0


def _bytes(dtype: str, dims: str) -> int:
    count = 1
    for d in filter(None, dims.split(",")):
        count *= int(d)
    return count * DTYPE_BYTES[dtype]


def computations(text: str) -> tuple[dict[str, list[str]], str]:
    """({computation name: its instruction lines, the root last}, the entry computation's name)."""
    comps, current, entry = {}, None, None
    for line in text.splitlines():
        if line.endswith("{") and not line.startswith(" "):
            name = line.split()[1] if line.startswith("ENTRY") else line.split()[0]
            current = comps.setdefault(name, [])
            entry = name if line.startswith("ENTRY") else entry
        elif line.startswith("}"):
            current = None
        elif current is not None and " = " in line:
            root = line.strip().startswith("ROOT ")
            current.append(line.strip().removeprefix("ROOT "))
            if root:  # the root last (XLA prints it last anyway; ROOT marks it)
                current.append(current.pop())
    return comps, entry


def top_level(comps: dict[str, list[str]], entry: str) -> set[str]:
    """The entry computation and what it runs as loop bodies, conditions or calls."""
    top, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name in top or name not in comps:
            continue
        top.add(name)
        todo += [callee for line in comps[name] for callee in CALLED.findall(line)]
    return top


TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')  # a while's backend_config


CONSTANT = re.compile(r"^(%[\w.\-]+) = s32\[\]\S* constant\((\d+)\)")


def condition_trips(comps: dict[str, list[str]], condition: str) -> int | None:
    """The trips of a loop whose condition compares its counter (from 0) with a constant, LT."""
    lines = comps.get(condition, [])
    constants = dict(m.groups() for m in (CONSTANT.match(line) for line in lines) if m)
    root = lines[-1] if lines else ""
    if "compare(" not in root or "direction=LT" not in root:
        return None
    operands = root.split("compare(", 1)[1].split(")", 1)[0].split(",")
    values = [int(constants[name.strip()]) for name in operands if name.strip() in constants]
    return values[0] if len(values) == 1 else None


def runs(comps: dict[str, list[str]], entry: str, unknown_trips: int = 1, inside: bool = False) -> dict[str, float]:
    """{computation: how many times one run of the program runs it}: a loop body (and condition)
    once per trip of its loop, XLA's known trip count (else the constant its condition compares
    the counter with; ``unknown_trips`` where neither is known), times the runs of the
    computation holding the loop. Top-level computations only, unless ``inside``: then fused
    computations too, and each of a conditional's N branches 1/N times (train/hlo_flops.py)."""
    out, todo = {}, [(entry, 1)]
    while todo:
        name, count = todo.pop()
        if name not in comps:
            continue
        out[name] = out.get(name, 0) + count
        for line in comps[name]:
            known = TRIP_COUNT.search(line)
            loop = re.search(r" while\(.*condition=(%[\w.\-]+)", line)
            trips = int(known.group(1)) if known else 1
            if loop and not known:  # the TPU compiler states no trip count: its condition's constant
                trips = condition_trips(comps, loop.group(1)) or unknown_trips
            callees = CALLED.findall(line)
            if inside and not loop:
                branches = BRANCHES.search(line)
                if branches:
                    names = [b.strip() for b in branches.group(1).split(",")]
                    todo += [(b, count / len(names)) for b in names]
                callees += FUSED.findall(line)
            todo += [(callee, count * trips) for callee in callees]
    return out


ALLOCATE = 'custom_call_target="AllocateBuffer"'  # the TPU compiler's scratch buffer: no data moves
# A Pallas call's own statement of its traffic (pl.CostEstimate, in its backend_config): what a
# group's call reads and writes of its members, where its operands are every member's arrays
KERNEL_BYTES = re.compile(r'"cost_estimate":\{[^}]*"bytes_accessed":"(\d+)"')


def _instructions(lines: list[str]):
    """(line, result name, its bytes, op, operand names) of a computation's instructions."""
    for line in lines:
        result, rhs = line.split(" = ", 1)
        match = INSTRUCTION.match(rhs)
        if match:
            out_type, op, args = match.groups()
            yield line, result, type_bytes(out_type), op, [a.strip().split()[-1] for a in args.split(",") if a.strip()]


def _sliced_parameters(lines: list[str]) -> dict[int, int]:
    """{parameter index: bytes read} of a fused computation's parameters that it reads only
    through dynamic-slices (a scan's stacked buffers: the slice is read, not the stack)."""
    params, uses = {}, {}
    for line, result, size, op, names in _instructions(lines):
        if op == "parameter":
            params[result] = int(line.split("parameter(", 1)[1].split(")", 1)[0])
            continue
        for position, name in enumerate(names):
            if name in params:  # the sliced operand is a dynamic-slice's first; its indices are read whole
                uses.setdefault(name, []).append((op == "dynamic-slice" and position == 0, size))
    return {params[name]: sum(size for _, size in used) for name, used in uses.items() if all(s for s, _ in used)}


def _in_place(lines: list[str]) -> tuple[dict[int, int], int] | None:
    """Where a fused computation's outputs (its root, or each element of a root tuple, through
    bitcasts) include dynamic-update-slices: ({the updated buffer's parameter index: 0}, the
    bytes it writes: each such output's update, every other output whole); None where none
    does. The buffer is updated in place (a scan's stacked residuals), neither read nor
    written whole."""
    found = list(_instructions(lines))
    if not found:
        return None
    by_name = {result: (size, op, names, line) for line, result, size, op, names in found}

    def through(name):  # past bitcasts
        while name in by_name and by_name[name][1] == "bitcast":
            name = by_name[name][2][0]
        return name

    _, root, size, op, names = found[-1]
    outputs = [through(n) for n in names] if op == "tuple" else [through(root)]
    buffers, written, any_update = {}, 0, False
    for name in outputs:
        size, op, names, _ = by_name.get(name, (0, "", [], ""))
        if op != "dynamic-update-slice":
            written += size
            continue
        any_update = True
        written += by_name.get(names[1], (0,))[0]
        buffer = by_name.get(through(names[0]))
        if buffer and buffer[1] == "parameter":
            buffers[int(buffer[3].split("parameter(", 1)[1].split(")", 1)[0])] = 0
    return (buffers, written) if any_update else None


def kernels(text: str, weighted: bool = False):
    """(line, op, bytes moved) of every top-level operation that moves memory; ``weighted``:
    times the runs of its computation (loops' trip counts)."""
    comps, entry = computations(text)
    counts = runs(comps, entry) if weighted else dict.fromkeys(top_level(comps, entry), 1)
    for name, count in counts.items():
        sizes, everywhere = {}, {}
        for line, result, size, op, names in _instructions(comps[name]):
            sizes[result], everywhere[result] = size, _all_bytes(line)
            if op in FREE or op in DONE:  # an async copy is charged at its start
                continue
            if op in ASYNC:  # read what is copied where it lies, write the destination
                shapes = SHAPE.findall(line.split(" = ", 1)[1].split(f" {op}(")[0])
                copied = _bytes(*shapes[-2][:2])  # the destination: the element before the flag
                source = sizes.get(names[0], 0) if names else 0  # the operand's HBM bytes (0: in VMEM)
                written = 0 if ON_CHIP in shapes[-2][2] else copied
                yield line, op, ((copied if source else 0) + written) * count
                continue

            fused = re.search(r"calls=(%[\w.\-]+)", line) if op == "fusion" else None
            body = comps.get(fused.group(1), []) if fused else []
            sliced = _sliced_parameters(body) if fused else {}
            place = _in_place(body) if fused else None
            if place:  # in place: the updates written, the buffers neither read nor written whole
                sliced, size = {**sliced, **place[0]}, place[1]
            operands = sum(sliced.get(i, sizes.get(name, 0)) for i, name in enumerate(names))
            if op == "custom-call" and ALLOCATE in line:  # a buffer set aside: no data moves
                continue
            stated = KERNEL_BYTES.search(line) if op == "custom-call" else None
            if stated:  # the kernel's own count, for the share of its operands and results in HBM
                whole = _all_bytes(line) + sum(everywhere.get(name, 0) for name in names)
                moved = int(stated.group(1)) * (size + operands) / whole if whole else 0
                yield line, op, moved * count
                continue
            yield line, op, (size + operands) * count


def split_bytes(text: str, weighted: bool = False) -> tuple[int, int]:
    """(bytes the top-level kernels move besides the Pallas calls, the Pallas calls' bytes
    (Triton or TPU), each charged its whole operands)."""
    rest = triton = 0
    for line, _, moved in kernels(text, weighted):
        if TRITON.search(line) or TPU_CALL.search(line):
            triton += moved
        else:
            rest += moved
    return rest, triton


def kernel_bytes(text: str, weighted: bool = False) -> int:
    return sum(split_bytes(text, weighted))


def triton_kernels(text: str) -> Counter:
    """{kernel name: calls} of the Triton custom calls (Pallas kernels) in the program."""
    return Counter(TRITON.findall(text))


# A Mosaic (Pallas TPU) call: its name is the instruction's, from the pallas_call's name scope
# ("jvp_jit_flash_attention__.2", "flash_mha_bwd_dq_block_q_major_128_..._128.3")
TPU_CALL = re.compile(r'^\s*(?:ROOT )?%([\w.\-]+) = .*custom_call_target="tpu_custom_call"', re.MULTILINE)


def tpu_kernels(text: str) -> Counter:
    """{kernel name: calls} of the Pallas TPU (Mosaic) custom calls in the program; a name is
    its instruction's without the numbering, the jvp/vmap/jit prefixes and a block-size suffix
    ("mhjax_tpu_attention_fwd", "mhjax_tpu_attention_bwd"; jax's "flash_attention")."""

    def short(name: str) -> str:
        name = re.sub(r"\.\d+$", "", name).split("_block_")[0].strip("_")
        return re.sub(r"^(?:jvp_|transpose_|vmap_)*(?:jit_)?", "", name)

    return Counter(short(name) for name in TPU_CALL.findall(text))


FIRST_SHAPE = re.compile(r" = \(?[a-z0-9]+\[(\d+)")


def kernel_members(text: str) -> list[int]:
    """The distinct leading dimensions of the Triton calls' (first) results, ascending."""
    return sorted(
        {int(m.group(1)) for line in text.splitlines() if TRITON.search(line) for m in [FIRST_SHAPE.search(line)] if m}
    )


def square_tensors(text: str, length: int) -> int:
    """How many lines of the program mention a value of any element type (f32, pred, u32, ...)
    of shape (..., length, length)."""
    pattern = re.compile(rf"\b[a-z]+[0-9]*\[(?:[0-9]+,)*{length},{length}\]")
    return sum(1 for line in text.splitlines() if pattern.search(line))


COLLECTIVE_KINDS = (
    "all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute", "collective-broadcast",
    "ragged-all-to-all",
)  # fmt: skip
# An instruction's op: `name = type op(`; async pairs counted once, at their -start
COLLECTIVE = re.compile(r"\s(" + "|".join(COLLECTIVE_KINDS) + r")(?:-start)?\(")


def collectives(text: str) -> Counter:
    """{kind: instructions} of the cross-device collectives in the program (an async pair once)."""
    return Counter(m.group(1) for line in text.splitlines() if " = " in line for m in [COLLECTIVE.search(line)] if m)
