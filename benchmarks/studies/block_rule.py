"""Bytes per member-step of the paper's model compiled for the H200 without a device, at a width,
with the block kernels (norm_dense, mlp_block) where they fit or with XLA's norms and MLP: what
pallas_block.block_parts' rule beyond the kernels' budget was decided from (docs/performance.md).
Heads 16, mlp 2 x width, T 100, batch 50, two members, the attention kernel on, strategy grouped.

    JAX_PLATFORMS=cpu python benchmarks/studies/block_rule.py WIDTH on|off
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(width: int, blocks: bool) -> None:
    import mhjax
    from mhjax.experiments import make_experiment
    from mhjax.models import pallas_block
    from mhjax.train import deviceless
    from mhjax.train import target as targets

    overrides = {
        "sweep.task": ("copy",), "sweep.heads": (16,), "sweep.seed": (0, 1), "model.width": width,
        "model.mlp_dim": 2 * width, "attention": "pallas", "strategy": "grouped", "train.snapshot_steps": None,
    }  # fmt: skip
    config = mhjax.load_config("paper", overrides)
    if not blocks:
        pallas_block.block_parts = lambda *a, **k: (False, False)
    start = time.time()
    report = deviceless.compile_for(make_experiment(config), targets.load("h200"), log=lambda m: None, only=("chunk",))
    for e in report.executables:
        kernels = (e.kernel_bytes_per_member_step or 0) / 1e9
        print(
            f"width {width} block kernels {'on' if blocks else 'off'} {pallas_block.block_parts(width, 2 * width)}: "
            f"{e.bytes_per_member_step / 1e9:.3f} GB per member-step besides the kernels' {kernels:.3f} GB "
            f"(at most), memory {e.total / 2**30:.2f} GiB, {sum(e.kernels.values())} Triton calls, "
            f"compile {time.time() - start:.0f} s"
        )


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
    elif len(sys.argv) != 3 or not sys.argv[1].isdigit() or sys.argv[2] not in ("on", "off"):
        sys.exit(print("usage: block_rule.py WIDTH on|off (WIDTH: a whole number)", file=sys.stderr) or 2)
    else:
        main(int(sys.argv[1]), sys.argv[2] == "on")
