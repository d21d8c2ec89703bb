"""HBM bytes one training step moves in the program XLA compiles for a TPU v5e slice, counted
without a TPU, by part of the model: what models/cost_tpu.py's calibration and
docs/performance.md's v5e table were measured with.

One device's training chunk of the sweep is compiled for libtpu's compile-only devices
(jax[tpu] at jax's version; JAX_PLATFORMS=cpu), as `mhjax train --dry-run --target v5e-8`
compiles it; its bytes are train/hlo.py's count (each top-level op's HBM operands and results
once per loop trip; VMEM values none, async copies once, in-place updates their slices, Pallas
calls their stated bytes), per member-step, grouped by the op's source (its metadata's last
two name scopes, forward or backward) to say where the bytes go.

    JAX_PLATFORMS=cpu /tmp/tpuvenv/bin/python benchmarks/studies/tpu_bytes.py [--attention auto|jax]
        [--seeds 8] [--steps 2] [--top 20] [--set model.seq_len=1024 ...]
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import mhjax  # noqa: E402
from mhjax.experiments import make_experiment  # noqa: E402
from mhjax.train import deviceless, hlo  # noqa: E402
from mhjax.train import target as targets  # noqa: E402


def parts(text: str, per: float) -> collections.Counter:
    """{(pass, source): bytes per member-step} of a compiled program's ops."""
    out = collections.Counter()
    for line, op, moved in hlo.kernels(text, weighted=True):
        named = re.search(r'op_name="([^"]+)"', line)
        scopes = [s for s in named.group(1).split("/") if s] if named else [f"({op})"]
        side = "backward" if named and "transpose(" in named.group(1) else "forward"
        out[(side, re.sub(r"\d+", "#", "/".join(scopes[-2:])))] += moved / per
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attention", default="auto")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2, help="the chunk's steps (bytes are per step)")
    parser.add_argument("--target", default="v5e-8")
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--set", nargs="*", default=[], help="config overrides FIELD=VALUE")
    args = parser.parse_args()
    overrides = {"attention": args.attention, "sweep.seed": tuple(range(args.seeds))}
    overrides.update({"train.steps": args.steps, "train.chunk_steps": args.steps, "train.snapshot_steps": ""})
    overrides.update(dict(item.split("=", 1) for item in args.set))
    experiment = make_experiment(mhjax.load_config("paper", overrides))
    texts = {}
    describe = deviceless._describe

    def keep(key, executable, *rest, **named):
        texts[key] = executable.as_text()
        return describe(key, executable, *rest, **named)

    deviceless._describe = keep
    report = deviceless.compile_for(experiment, targets.load(args.target), log=print, only=("chunk",))
    chunk = report.executables[0]
    per = chunk.key[2] * max(report.members.get(chunk.key[1], 1), 1)
    counted = parts(texts[chunk.key], per)
    total = sum(counted.values())
    print(f"{args.target} chunk, {report.members} members per device, attention {args.attention}: {total / 1e9:.3f} GB")
    print(f"  per member-step (Pallas calls {(chunk.kernel_bytes_per_member_step or 0) / 1e9:.3f} GB of it)")
    for (side, source), moved in counted.most_common(args.top):
        print(f"  {moved / 1e6:9.2f} MB  {side:<8}  {source}")


if __name__ == "__main__":
    main()
