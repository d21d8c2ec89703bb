"""What mhjax's TPU attention kernel (pallas_tpu_attention.py) needs of a chip's VMEM, and the
scoped limit it asks the compiler for; numbers only (no Pallas), so a planner sizes a run
before anything is traced.

Tiles: sequences up to WHOLE rows run as one tile (every query row against every key row);
longer ones are padded to a multiple of TILE rows and tiled in both queries and keys, so the
kernel's per-step work is a (TILE, TILE) square whatever T is. What still grows with T is the
backward's resident (T, 3D) gradient block and its (T, D) float32 dk, dv accumulators.

VMEM per chip generation: jax 0.10.2's jax/_src/pallas/mosaic/tpu_info.py (its per-core
``vmem_capacity_bytes``; v5e: 128 MiB, as the Cloud TPU v5e docs give); Mosaic's default
scoped limit is 16 MiB (32 MiB on v6e), which a long T or 16 heads outgrows. The kernel asks
for HEADROOM of the physical VMEM: the rest stays for the compiler's own internal scratch.
"""

from __future__ import annotations

import contextlib

LANES = 128  # a vreg's lanes: the last dimension of a VMEM value is padded to a multiple
WHOLE = 512  # sequences up to this many rows: one tile
TILE = 256  # longer ones: tiles of this many rows (queries and keys), T padded to a multiple
MIB = 1 << 20
VMEM_BYTES = {  # device_kind -> physical VMEM per TensorCore (tpu_info.py, jax 0.10.2)
    "TPU v4": 16 * MIB,
    "TPU v4 lite": 16 * MIB,
    "TPU v5 lite": 128 * MIB,
    "TPU v5e": 128 * MIB,
    "TPU v5": 64 * MIB,
    "TPU v5p": 64 * MIB,
    "TPU v6 lite": 128 * MIB,
    "TPU v6e": 128 * MIB,
    "TPU7x": 64 * MIB,
}
DEFAULT_CHIP = "TPU v5 lite"  # a TPU backend whose chip is not known here: the preset auto assumes (cost.py)
HEADROOM = 0.75  # of the physical VMEM, the scoped limit asked for (v5e: 96 MiB)
# (rows, cols) float32 temporaries of one grid step the compiler keeps live at once (scores,
# exponentials, hash bits, keep mask, dp, ds; calibrated on Mosaic's own scoped-allocation
# report, see need's test)
TEMPORARIES = {"forward": 6, "backward": 10}
_target: list[str] = []  # the chip a deviceless compile targets (for_chip)


def tiles(length: int) -> tuple[int, int]:
    """(rows per tile, padded length): one tile of T rows up to WHOLE, else TILE rows and T
    rounded up to a multiple of them."""
    if length <= WHOLE:
        return length, length
    return TILE, -(-length // TILE) * TILE


def tile_pairs(length: int) -> int:
    """(query tile, key tile) pairs the kernel runs: those on or below the diagonal."""
    rows, padded = tiles(length)
    steps = padded // rows
    return steps * (steps + 1) // 2


def _block(rows: int, cols: int, itemsize: int) -> int:
    """VMEM bytes of a (rows, cols) value: rows to the sublane tile (8 of 32 bits, 16 of 16),
    columns to the lanes."""
    sublanes = 8 * max(1, 4 // itemsize)
    return -(-rows // sublanes) * sublanes * -(-cols // LANES) * LANES * itemsize


def need(length: int, width: int, heads: int, itemsize: int) -> dict[str, int]:
    """{"forward": bytes, "backward": bytes} of scoped VMEM one call of the kernel needs at
    sequence length ``length``, attention width ``width`` (heads x head size), ``heads`` and
    the q/k/v element size ``itemsize`` (4: float32, 2: bfloat16): its blocks double-buffered
    (the pipeline copies the next step's in while this one runs), its scratch, and its
    temporaries."""
    rows, padded = tiles(length)
    block = lambda r, c, size=itemsize: _block(r, c, size)  # noqa: E731
    tile_in = 2 * block(rows, 3 * width)  # the query tile and the key tile, (rows, 3D) each
    temps = lambda kind: TEMPORARIES[kind] * _block(rows, rows, 4)  # noqa: E731
    forward = (
        2 * (tile_in + block(rows, width) + block(rows, heads, 4))
        + block(rows, width, 4)
        + 2 * block(rows, LANES, 4)
        + temps("forward")
    )
    backward = (
        2 * (tile_in + 2 * block(rows, width) + block(rows, heads, 4) + block(padded, 3 * width))
        + block(rows, width, 4)
        + 2 * block(padded, width, 4)
        + temps("backward")
    )
    return {"forward": forward, "backward": backward}


def physical(device_kind: str | None) -> int | None:
    """The chip's VMEM per core (None: not a TPU this table knows)."""
    return VMEM_BYTES.get(device_kind or "")


def limit(device_kind: str | None = None) -> int | None:
    """The scoped VMEM limit the kernel asks for on ``device_kind`` (default: the chip being
    compiled for, chip(), else DEFAULT_CHIP); None for a kind the table lacks (the compiler's
    default applies)."""
    size = physical(device_kind or chip() or DEFAULT_CHIP)
    return None if size is None else int(size * HEADROOM)


def chip(probe: bool = True) -> str | None:
    """The TPU being compiled for: a deviceless compile's target (for_chip), else this
    process's default device where it is a TPU. Without ``probe`` (planning) only where jax's
    backend has started already: asking for devices starts it, which must wait for
    jax.distributed.initialize."""
    if _target:
        return _target[-1]
    import jax
    from jax._src import xla_bridge

    if not probe and not xla_bridge.backends_are_initialized():
        return None
    kind = jax.devices()[0].device_kind
    return kind if kind in VMEM_BYTES else None


@contextlib.contextmanager
def for_chip(device_kind: str):
    """Trace the kernel for ``device_kind`` (a compile for a TPU this process does not have)."""
    _target.append(device_kind)
    try:
        yield
    finally:
        _target.pop()


def fits(length: int, width: int, heads: int, itemsize: int, device_kind: str | None = None) -> bool:
    """Whether both of the kernel's calls fit the scoped limit on ``device_kind``."""
    cap = limit(device_kind)
    return cap is None or max(need(length, width, heads, itemsize).values()) <= cap


def longest_fitting(width: int, heads: int, itemsize: int, device_kind: str | None = None) -> int:
    """The longest T (a multiple of TILE) whose kernel fits, for a one-line refusal."""
    low, high = WHOLE, 1 << 22
    while high - low > TILE:
        middle = (low + high) // 2 // TILE * TILE
        low, high = (middle, high) if fits(middle, width, heads, itemsize, device_kind) else (low, middle)
    return low


DTYPE_NAMES = {4: "float32", 2: "bfloat16"}


def refusal(length: int, shapes, itemsize: int, device_kind: str | None = None) -> str | None:
    """None where the kernel fits ``device_kind``'s VMEM (default: a deviceless compile's
    target, else DEFAULT_CHIP, the preset models/cost.py prices a TPU as) at ``length`` for every
    (attention width, heads) of ``shapes``; else why not, with what fits: the longest T at that head count
    in this dtype, and in bfloat16 where this is float32."""
    kind = device_kind or chip(probe=False) or DEFAULT_CHIP
    for width, heads in sorted(set(shapes), key=lambda s: -max(need(length, *s, itemsize).values())):
        if fits(length, width, heads, itemsize, kind):
            continue
        needed = max(need(length, width, heads, itemsize).values())
        other = (
            f", T <= {longest_fitting(width, heads, 2, kind):,} in bfloat16"
            if itemsize == 4 and longest_fitting(width, heads, 2, kind) > longest_fitting(width, heads, 4, kind)
            else ""
        )
        return (
            f"the TPU kernel needs {needed / MIB:.1f} MiB of VMEM at T = {length:,}, {heads} heads, "
            f"{DTYPE_NAMES.get(itemsize, itemsize)} (limit {limit(kind) / MIB:.0f} MiB on {kind}); it fits "
            f"T <= {longest_fitting(width, heads, itemsize, kind):,} at {heads} heads{other}"
        )
    return None
