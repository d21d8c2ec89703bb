"""The cost model's predictions for benchmarks/accelerator.sh's training stages, on this machine
(nothing compiles): the rate each stage's dry run will print on the device, for RESULTS.md's plan.

    python benchmarks/studies/accelerator_predictions.py [--corpus FILE] [--json OUT]

Per stage and attention path (jax; pallas, the kernels priced as reading the compute dtype:
models/cost_dtype.py): the strategy `auto` picks on a GPU, member-steps/s, the compiled
program's GB and the GFLOP per member-step, memory per device; for shard2 also one device's rate.
--corpus: the text stage's file (default: 1,024 KiB of Python's docs written to a temporary file,
as accelerator.sh writes it on the device).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from mhjax.experiments import make_experiment  # noqa: E402
from mhjax.workflows.configs import load_config  # noqa: E402

SEEDS = "0,1,2,3,4,5,6,7"


def stages(corpus: str) -> dict:
    """{stage: (config, overrides, devices)}, as accelerator.sh runs them."""
    paper = {"sweep.seed": SEEDS}
    return {
        "paper64": ("configs/paper.py", paper, 1),
        "paper_bf16": ("configs/paper.py", {**paper, "model.dtype": "bfloat16"}, 1),
        "text_bf16": ("configs/text.py", {"data.path": corpus, "model.dtype": "bfloat16"}, 1),
        "shard2": ("configs/paper.py", paper, 2),
    }


def predict(config_path: str, overrides: dict, devices: int, attention: str) -> dict:
    config = load_config(str(ROOT / config_path), {**overrides, "attention": attention}, validate=False)
    experiment = make_experiment(config)
    plan = experiment.plan("gpu", devices, planned=True)  # as on a machine with that many GPUs
    strategy = plan.strategy
    p = plan.predict()
    out = {
        "strategy": strategy,
        "member_steps_per_s": p["member_steps_per_s"],
        "compiled_gb_per_member_step": p["compiled_bytes_per_member_step"] / 1e9,
        "gflop_per_member_step": p["flops_per_member_step"] / 1e9,
        "memory_per_device_gib": p["memory_per_device_bytes"] / 2**30,
        "members": len(experiment.members),
    }
    if devices > 1:
        out["one_device_member_steps_per_s"] = plan.predict(devices=1)["member_steps_per_s"]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", help="the text stage's corpus (default: Python's docs, 1,024 KiB)")
    parser.add_argument("--json", help="write the predictions here")
    args = parser.parse_args(argv)
    corpus = args.corpus
    if not corpus:
        corpus = os.path.join(tempfile.mkdtemp(prefix="mhjax-predictions-"), "python_docs.txt")
        script = str(ROOT / "examples" / "python_docs.py")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        subprocess.run([sys.executable, script, corpus, "--kib", "1024"], check=True, capture_output=True, env=env)
    payload = {}
    for name, (path, overrides, devices) in stages(corpus).items():
        for attention in ("jax", "pallas"):
            p = payload.setdefault(name, {})[attention] = predict(path, overrides, devices, attention)
            one = p.get("one_device_member_steps_per_s")
            beside = f" (one device {one:,.0f}: {p['member_steps_per_s'] / one:.2f}x)" if one else ""
            rate, gb, gflop = p["member_steps_per_s"], p["compiled_gb_per_member_step"], p["gflop_per_member_step"]
            print(
                f"{name:<11} {attention:<7} {p['strategy']:<12} {rate:>9,.0f} member-steps/s{beside}, "
                f"{gb:.3f} GB and {gflop:.2f} GFLOP per member-step, {p['memory_per_device_gib']:.2f} GiB per device"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
