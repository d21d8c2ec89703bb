"""Cost of a head-count sweep per strategy on an accelerator, measured without one.

For every strategy of the config's sweep (and the attention variants of hlo_cost.py):
XLA's HLO FLOPs and bytes accessed per member-step of the compiled programs (JAX
attention path, as on a GPU or TPU), the analytic FLOPs (mhjax.models.flops: matmuls
only, causal attention counted as half) and their ratio, peak temporary memory, compile
time, the analytic cost model's own figures (mhjax.models.cost) and the member-steps/s a
roofline predicts on ``--device`` from the HLO figures.

    python benchmarks/studies/cost_model.py [--json OUT] [--config configs/paper.py] [--device h200|tpu-v5e]
        [--peak-tflops X --hbm-gbs Y] [--strategies fused,grouped,one_program,...] [--seeds 0,1,...]

A strategy ``S:V`` is strategy S with attention variant V (btft, bf16, or pallas: the
fused Pallas kernel, its HBM traffic and FLOPs counted analytically and XLA's count of the
rest of the program compiled with the kernel replaced by an opaque op of the same inputs
and outputs, hlo_cost.py). The other rows run the JAX attention path (config.attention =
"jax"), what XLA can count. ``groups_unrolled``
is one_program as it was first built: grouped's vmapped programs written side by side in
one program (engine.Unrolled), grouped's cost but the whole step compiled once per head
count. The compile times are this machine's (a CPU) and include XLA's CPU code generation.
"""

from __future__ import annotations

import argparse
import copy
import datetime
import importlib.util
import json
import os
import platform
import sys
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "studies"))
sys.path.insert(0, str(ROOT))

import hlo_cost  # noqa: E402
from hlo_parts import KERNELS  # noqa: E402

from mhjax.experiments.sequence import SequenceExperiment  # noqa: E402
from mhjax.models import cost  # noqa: E402
from mhjax.models.flops import train_step_flops  # noqa: E402
from mhjax.plan import pricing  # noqa: E402
from mhjax.train.engine import Program, Unrolled  # noqa: E402

DEFAULT_STRATEGIES = (
    "fused,grouped,one_program,groups_unrolled,fused:btft,fused:bf16,grouped:bf16,one_program:bf16,one_program:pallas"
)


def load_config(path):
    spec = importlib.util.spec_from_file_location("mhjax_cost_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def strategy_of(spec: str) -> str:
    return spec.partition(":")[0]


def device_from(args) -> cost.Device:
    device = cost.DEVICES[args.device]
    if args.peak_tflops or args.hbm_gbs:
        device = device._replace(
            name=f"{device.name} (overridden)",
            peak_flops=(args.peak_tflops or device.peak_flops / 1e12) * 1e12,
            hbm_bytes_per_s=(args.hbm_gbs or device.hbm_bytes_per_s / 1e9) * 1e9,
            effective_bytes_per_s=args.hbm_gbs * 1e9 if args.hbm_gbs else device.effective_bytes_per_s,
        )
    return device


def programs_of(experiment, strategy: str) -> list[Program]:
    """The program structure an accelerator gets under ``strategy``."""
    if strategy != "groups_unrolled":
        return experiment.programs(strategy, "gpu")
    grouped = experiment.programs("grouped", "gpu")
    recipe = Unrolled([p.recipe for p in grouped], [len(p.members) for p in grouped])
    return [Program("all", [i for p in grouped for i in p.members], recipe)]


def experiment_with(config, attention: str) -> SequenceExperiment:
    """The sweep at ``attention``, its layers unrolled: XLA's cost analysis counts a loop's body
    once, so a scanned step (config.model.scan_layers=on, or auto on a TPU) would
    count one layer of num_layers. The step's arithmetic and traffic per layer are the same."""
    config = copy.deepcopy(config)
    config.attention = attention
    config.model.scan_layers = "off"
    return SequenceExperiment(config)


def run_strategy(config, spec: str, device: cost.Device) -> dict:
    strategy, _, variant = spec.partition(":")
    kernel = variant == hlo_cost.KERNEL_VARIANT
    experiment = experiment_with(config, "pallas" if kernel else "jax")
    programs = programs_of(experiment, strategy)
    with hlo_cost.variant(variant or None):
        measured = hlo_cost.measure(experiment, programs, kernel)
    m, d = experiment.config.model, experiment.config.data
    analytic = train_step_flops(d.batch_size, m.seq_len, m.width, m.num_layers, m.mlp_dim, m.vocab_size)
    hlo = cost.Cost(measured["flops_per_member_step"], measured["bytes_per_member_step"])
    # The analytic model knows the library's own attention paths (JAX, the Pallas kernel), not the variants.
    groups = pricing.program_groups(programs)
    model = None if variant and not kernel else cost.sweep_cost(cost.Shape.of(config), groups, device, kernel=kernel)
    # the counts are of unrolled layers (experiment_with), as a GPU runs them; scan_layers=on adds the stacks
    scanned = cost.sweep_cost(cost.Shape.of(config), groups, device, kernel=True, scanned=True) if kernel else None
    scale = lambda key, unit: None if model is None else model[key] / unit  # noqa: E731
    # XLA's count priced as cost.py prices its own: the kernel's bytes exact, the rest converted
    # to the compiled GPU program's count (Device.compiled_bytes; on the JAX path, all that the
    # model's rest-of-step terms do not count taken as the attention core's), dots (the analytic
    # matmuls) at the device's dot rate.
    kernel_bytes = measured["kernel_bytes_per_member_step"] if kernel else 0.0
    calibrated = None
    if model is not None:
        dots = min(model["dot_flops_per_member_step"], hlo.flops)
        core = 0.0 if kernel else max(0.0, hlo.bytes - model["rest_bytes_per_member_step"])
        priced = cost.Cost(hlo.flops, hlo.bytes, dots, core, kernel_bytes)
        gpu_bytes = cost.device_bytes(priced, device)
        compute, _ = cost.times(priced, device)
        calibrated = {
            "gb_per_member_step": gpu_bytes / 1e9,
            "member_steps_per_s": 1.0 / max(compute, gpu_bytes / device.bandwidth()),
            "bound": "compute" if compute > gpu_bytes / device.bandwidth() else "memory",
        }
    return {
        "gflop_per_member_step": hlo.flops / 1e9,
        "gb_per_member_step": hlo.bytes / 1e9,
        "analytic_gflop_per_member_step": analytic / 1e9,
        "hlo_over_analytic_flops": hlo.flops / analytic,
        # the plain roofline of XLA:CPU's count: every FLOP at the fp32 peak, bytes at the peak bandwidth
        "roofline_member_steps_per_s": 1.0 / max(hlo.flops / device.peak_flops, hlo.bytes / device.hbm_bytes_per_s),
        "cost_model_gflop_per_member_step": scale("flops_per_member_step", 1e9),
        "cost_model_gb_per_member_step": scale("bytes_per_member_step", 1e9),
        "cost_model_member_steps_per_s": scale("member_steps_per_s", 1),
        "cost_model_compiled_gb_per_member_step": scale("compiled_bytes_per_member_step", 1e9),
        "cost_model_bound_by_heads": None if model is None else {str(h): b for h, b in model["bound_by_heads"].items()},
        "cost_model_scanned": None
        if scanned is None
        else {k: scanned[k] for k in ("compiled_bytes_per_member_step", "member_steps_per_s")},
        "calibrated": calibrated,
        "kernel_gb_per_member_step": measured["kernel_bytes_per_member_step"] / 1e9 if kernel else None,
        "kernel_gflop_per_member_step": measured["kernel_flops_per_member_step"] / 1e9 if kernel else None,
        "gb_by_part_per_member_step": {k: v / 1e9 for k, v in measured["bytes_by_part_per_member_step"].items()},
        "peak_temp_bytes": measured["peak_temp_bytes"],
        "compile_s": measured["compile_s"],
        "programs": measured["programs"],
        "members": measured["members"],
        # A variant changes the numbers as well as the cost: by how much, on one step.
        # (the kernel computes the library's function: tests/test_pallas_attention.py)
        "accuracy": hlo_cost.accuracy(experiment, programs, variant) if variant and not kernel else None,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--config", default=str(ROOT / "configs" / "paper.py"))
    parser.add_argument(
        "--device",
        default="h200",
        choices=sorted(cost.DEVICES),
        help="roofline preset (sources in mhjax/models/cost.py)",
    )
    parser.add_argument("--peak-tflops", type=float, default=None, help="override the preset's peak TFLOP/s")
    parser.add_argument(
        "--hbm-gbs", type=float, default=None, help="override the preset's (calibrated) memory bandwidth, GB/s"
    )
    parser.add_argument(
        "--strategies", default=DEFAULT_STRATEGIES, help="comma-separated; S:V = strategy S with attention variant V"
    )
    parser.add_argument("--seeds", default=None, help="override config.sweep.seed, e.g. 0,1,2,3,4,5,6,7")
    args = parser.parse_args(argv)
    config = load_config(args.config)
    if args.seeds:
        config.sweep.seed = tuple(int(s) for s in args.seeds.split(","))
    experiment = experiment_with(config, "jax")
    device = device_from(args)
    print(
        f"{len(experiment.members)} members on {device.name}. steps/s: member-steps/s predicted from XLA's count as "
        f"the compiled GPU program's, dots at {device.dot_rate() / 1e12:g} TFLOP/s, the rest at "
        f"{device.peak_flops / 1e12:g}, {device.bandwidth() / 1e9:,.0f} GB/s (models/cost.py's calibration); "
        f"roofline/s: XLA:CPU's count at the fp32 peak and {device.hbm_bytes_per_s / 1e9:g} GB/s, uncalibrated",
        flush=True,
    )
    header = (
        f"{'strategy':<18} {'GFLOP':>7} {'GB':>6} {'/analytic':>9} {'model GFLOP':>11} {'model GB':>8} "
        f"{'temp GB':>8} {'compile s':>9} {'roofline/s':>10} {'steps/s':>8}"
    )
    print(header, flush=True)
    results = {}
    for spec in args.strategies.split(","):
        r = results[spec] = run_strategy(config, spec, device)
        predicted = f"{r['calibrated']['member_steps_per_s']:.0f}" if r["calibrated"] else "-"
        model = [
            f"{x:.2f}" if x is not None else "-"
            for x in (r["cost_model_gflop_per_member_step"], r["cost_model_gb_per_member_step"])
        ]
        print(
            f"{spec:<18} {r['gflop_per_member_step']:>7.2f} {r['gb_per_member_step']:>6.2f} "
            f"{r['hlo_over_analytic_flops']:>9.2f} "
            f"{model[0]:>11} {model[1]:>8} {r['peak_temp_bytes'] / 1e9:>8.2f} "
            f"{r['compile_s']:>9.1f} {r['roofline_member_steps_per_s']:>10.0f} {predicted:>8}",
            flush=True,
        )
        if r["calibrated"] is not None:
            c, bound = r["calibrated"], r["cost_model_bound_by_heads"]
            heads = ", ".join(
                f"{h} {b['bound']} ({b['compute_s'] * 1e6:.0f}/{b['memory_s'] * 1e6:.0f} us)" for h, b in bound.items()
            )
            print(
                f"{'':<18} calibrated ({device.name}, {device.bandwidth() / 1e12:.2f} TB/s effective, dots at "
                f"{device.dot_rate() / 1e12:g} TFLOP/s): XLA's count as the GPU program's "
                f"{c['gb_per_member_step']:.2f} GB, "
                f"{c['member_steps_per_s']:,.0f}/s ({c['bound']}-bound); models/cost.py "
                f"{r['cost_model_compiled_gb_per_member_step']:.2f} GB, {r['cost_model_member_steps_per_s']:,.0f}/s",
                flush=True,
            )
            print(
                f"{'':<18} models/cost.py per head count, bound (compute/memory per member-step): {heads}", flush=True
            )
            if r["cost_model_scanned"]:
                s = r["cost_model_scanned"]
                print(
                    f"{'':<18} with config.model.scan_layers=on (scanned layers; these "
                    f"counts are of unrolled ones): models/cost.py {s['compiled_bytes_per_member_step'] / 1e9:.2f} GB "
                    f"compiled, {s['member_steps_per_s']:,.0f}/s",
                    flush=True,
                )
        if r["kernel_gb_per_member_step"] is not None:
            parts = ", ".join(f"{k} {v:.3f}" for k, v in r["gb_by_part_per_member_step"].items() if k != KERNELS)
            print(f"{'':<18} GB: kernel {r['kernel_gb_per_member_step']:.3f}; the rest by part (approx.): {parts}")
        if r["accuracy"]:
            print(
                f"{'':<18} one step against fp32 {strategy_of(spec)}: loss {r['accuracy']['loss_rel_diff']:.1e}, "
                f"gradient {r['accuracy']['grad_rel_l2']:.1e} (relative)",
                flush=True,
            )
    ratio = None
    if "one_program" in results and "grouped" in results:
        one, grouped = results["one_program"], results["grouped"]
        ratio = {
            "flops": one["gflop_per_member_step"] / grouped["gflop_per_member_step"],
            "bytes": one["gb_per_member_step"] / grouped["gb_per_member_step"],
        }
        print(f"one_program / grouped: FLOPs {ratio['flops']:.3f}x, bytes {ratio['bytes']:.3f}x (target <= 1.25x)")
    payload = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "config": os.path.relpath(args.config, ROOT) if os.path.isabs(args.config) else args.config,
        "members": len(experiment.members),
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "jax": jax.__version__,
            "backend": jax.default_backend(),
        },
        "device": device._asdict(),
        "attention": "jax (config.attention=jax); S:pallas rows: the Pallas kernel, counted analytically",
        "strategies": results,
        "one_program_over_grouped": ratio,
    }
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(payload, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
