"""Training throughput of a head-count sweep: mhjax's strategies against PyTorch.

The paper model (width 64, 4 layers, MLP 128, vocab 256, batch 50, length 100, dropout
0.1, Adam) and the sweep over 1/4/8/16 heads (copy task, one seed: four members), run as
  unrolled    all members in one program, each unbatched (strategy "unrolled")
  fused       all head counts in one vmapped program (strategy "fused", Sweep.run_chunk)
  grouped     one program per head count (strategy "grouped", Sweep.run_chunk)
  sequential  each member alone: the engine's train_step jitted per head count, called
              once per step from Python (no vmap, no scan): a plain JAX loop
  torch       the same model and step in PyTorch (benchmarks/torch_model.py), one model
              at a time, members one after another (as the paper's reference code trains)
  torch_ensemble  PyTorch's strongest plain way: per head count, its members (--seeds) in
              one torch.func ensemble (stack_module_state + functional_call + vmap with
              randomness="different", Adam on the stacked parameters), head counts one
              after another
PyTorch runs on CUDA when it sees a GPU, else on the CPU. And an fp32 matmul (2048^2, jax
and torch) for the machine's peak. Everything is timed in ONE process, interleaved (every
repetition runs every strategy once, in turn), and the medians over repetitions are
reported, so ratios stay honest on a noisy, shared machine.

Reported per strategy: member-steps/s, tokens/s, model FLOPs per member-step (analytic,
mhjax.models.flops: matmuls only, causal attention counted as half; independent of the
head count), achieved FLOP/s, MFU (achieved / the best fp32 matmul FLOP/s measured in
this run), per-head-count ms per member-step, and memory (mhjax: peak of the compiled
program's buffers from XLA's memory analysis; torch: sampled process-RSS rise during a
step, on CUDA the peak of allocated memory). JSON keys ``ratio_vs_torch`` (best mhjax
strategy's sweep member-steps/s over the one-model PyTorch trainer's),
``ratio_vs_torch_ensemble`` (the same over the torch.func ensemble's) and ``mfu`` (that
strategy's sweep MFU: all its FLOPs over all its time). ``--seeds N`` trains N members per
head count in every runner but the one-model one (whose rate does not depend on N);
``--strategies one_program:pallas`` pins the attention implementation (config.attention
where the config has it); ``attention_resolved`` (and each strategy's ``attention``) is what it
runs on this backend (on a TPU ``pallas`` is mhjax's Mosaic kernel, ``pallas_tpu``).
``--no-torch [REASON]`` skips both peers; ``torch_skipped`` says why (None: they ran).

Then scaling with work, for one head count (4): members per program (1, 2, 4, 8, ...:
seeds), vmapped in one grouped program ("members=N") and unrolled ("unrolled=N"), and
sequence length (50, 100, 200).

    python benchmarks/throughput.py [--json OUT] [--quick] [--reps N] [--steps N] [--seeds N]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import jax

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from runners import (  # noqa: E402
    HEADS,
    MatmulPeak,
    ProgramView,
    SequentialRunner,
    SweepRunner,
    TorchEnsembleRunner,
    TorchRunner,
    make_config,
    model_flops,
    pick_torch_threads,
    torch_device,
)

from mhjax.experiments.sequence import SequenceExperiment  # noqa: E402

TORCH_LABELS = ("torch", "torch_ensemble")

# ---------------------------------------------------------------- measurement


def _memory_kind(label, device):
    if label not in TORCH_LABELS:
        return "xla_program_peak"
    return "cuda_max_allocated" if device == "cuda" else "rss_rise"


def interleaved(runners, steps, reps, log, extra=None):
    """{label: [ {heads: seconds} per rep ]}, runners taking turns in every repetition."""
    samples = {r.label: [] for r in runners}
    for rep in range(reps):
        for r in runners:
            samples[r.label].append(r.run(steps))
        if extra is not None:
            extra()
        log(
            f"  rep {rep + 1}/{reps}: "
            + ", ".join(
                f"{r.label} {1000 * sum(samples[r.label][-1].values()) / (steps * r.members):.0f}" for r in runners
            )
            + " ms/member-step"
        )
    return samples


def summarise(runner, reps_samples, steps, flops_per_step, peak, tokens_per_step):
    totals = [sum(s.values()) for s in reps_samples]
    seconds = statistics.median(totals)
    rate = runner.members * steps / seconds
    per_heads = {}
    for key in reps_samples[0]:
        per_heads[str(key)] = 1000 * statistics.median(s[key] for s in reps_samples) / steps
    achieved = rate * flops_per_step
    return {
        "member_steps_per_s": rate,
        "tokens_per_s": rate * tokens_per_step,
        "ms_per_member_step": 1000 / rate,
        "flops_per_member_step": flops_per_step,
        "achieved_flops_per_s": achieved,
        "mfu": achieved / peak,
        "ms_per_step_by_heads": per_heads,
        "seconds_per_rep": totals,
        "members": runner.members,
        "last_loss": getattr(runner, "last_loss", None),
    }


def arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions, smaller scaling sweep")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 3, quick 2)")
    parser.add_argument("--steps", type=int, default=None, help="steps per repetition per member (default 3, quick 2)")
    parser.add_argument(
        "--members", default=None, help="members per program for the scaling part (default 1,2,4,8; quick 1,2,4)"
    )
    parser.add_argument(
        "--lengths", default=None, help="sequence lengths for the scaling part (default 50,100,200; quick 50,100)"
    )
    parser.add_argument("--length", type=int, default=100, help="sequence length of the main part (paper: 100)")
    parser.add_argument("--seeds", type=int, default=1, help="members per head count (default 1: four members)")
    parser.add_argument(
        "--no-torch",
        nargs="?",
        const="asked (--no-torch)",
        default=None,
        metavar="REASON",
        help="skip PyTorch (both peers); REASON goes to the JSON's torch_skipped",
    )
    parser.add_argument("--no-scaling", action="store_true", help="skip the scaling part")
    parser.add_argument(
        "--strategies",
        default="unrolled,fused,grouped,sequential",
        help="mhjax strategies to time; NAME:IMPL pins the attention implementation (e.g. grouped:jax)",
    )
    parser.add_argument(
        "--cache-dir",
        default=os.path.expanduser("~/.cache/mhjax/jax_compilation_cache"),
        help="JAX persistent compilation cache (reruns skip compiling); '' to disable",
    )
    return parser.parse_args(argv)


def main(argv=None):
    args = arguments(argv)
    if args.cache_dir:
        jax.config.update("jax_compilation_cache_dir", args.cache_dir)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    reps = args.reps or (2 if args.quick else 3)
    steps = args.steps or (2 if args.quick else 3)
    members_list = [int(x) for x in (args.members or ("1,2,4" if args.quick else "1,2,4,8")).split(",")]
    lengths = [int(x) for x in (args.lengths or ("50,100" if args.quick else "50,100,200")).split(",")]
    t0 = time.perf_counter()

    def log(msg):
        print(f"[{time.perf_counter() - t0:6.0f}s] {msg}", flush=True)

    backend = jax.default_backend()
    attention = SequenceExperiment(make_config(HEADS)).plan(backend).attention.implementation
    kernel = attention == "cpu_kernel"
    log(
        f"jax {jax.__version__} on {backend} ({len(jax.devices())} device(s)), {os.cpu_count()} cores; "
        f"attention (config.attention=auto): {attention}"
    )
    seeds = tuple(range(args.seeds))
    config = make_config(HEADS, length=args.length, seeds=seeds)
    flops = model_flops(config)
    tokens = config.data.batch_size * config.model.seq_len

    use_torch = args.no_torch is None
    torch_skipped = args.no_torch  # why the PyTorch peers did not run (None: they did)
    torch_threads, torch_thread_times, device = (None, {}, None)
    if torch_skipped:
        log(f"PyTorch peers skipped: {torch_skipped}")
    if use_torch:
        try:
            import torch
        except ImportError:
            torch_skipped = "torch not installed (pip install -e '.[bench]')"
            log(f"{torch_skipped}; skipping it")
            use_torch = False
    if use_torch:
        device = torch_device()
        log(f"torch {torch.__version__} on {device}")
        if device == "cpu":
            torch_threads, torch_thread_times = pick_torch_threads(config, log)

    runners, resolved = [], {}
    for label in args.strategies.split(","):
        # "name:impl" times strategy `name` with config.attention = `impl` (auto | jax |
        # cpu_kernel | pallas, see mhjax/models/attention.py).
        name, _, impl = label.partition(":")
        log(f"compiling {label} ...")
        runner_config = make_config(
            HEADS, length=args.length, seeds=seeds, strategy="grouped" if name == "sequential" else name
        )
        if impl:
            runner_config.attention = impl
        # what config.attention runs here (on a TPU "pallas" is mhjax's Mosaic kernel, pallas_tpu)
        resolved[label] = SequenceExperiment(runner_config).plan(backend).attention.implementation
        if name == "sequential":
            runner = SequentialRunner(runner_config, label)
        else:
            runner = SweepRunner(runner_config, label)
        start = time.perf_counter()
        runner.warm(steps)
        runner.compile_s = time.perf_counter() - start
        runners.append(runner)
        log(f"  {name}: first chunk (compile + run) {runner.compile_s:.1f} s")
        if args.json:  # what is known so far, in case the run is stopped before the end
            partial = {
                "completed": False,
                "first_chunk_s": {r.label: r.compile_s for r in runners},
                "attention_resolved": resolved,
                "torch_skipped": torch_skipped,
            }
            Path(args.json).write_text(json.dumps(partial, indent=2))
    if use_torch:
        for cls in (TorchRunner, TorchEnsembleRunner):
            runner = cls(config, torch_threads, device=device)
            start = time.perf_counter()
            runner.warm(1)
            runner.compile_s = time.perf_counter() - start  # first step: allocation, kernel selection
            runners.append(runner)
            log(f"  {runner.label}: {runner.members} members, first step {runner.compile_s:.1f} s")
    peak = MatmulPeak(use_torch, device or "cpu")
    peak.warm()

    log(f"timing: {reps} repetitions x {steps} steps per member, interleaved")
    samples = interleaved(runners, steps, reps, log, extra=lambda: peak.run(torch_threads))
    peaks = peak.flops()
    peak_flops = max(peaks.values())
    results = {}
    for r in runners:
        results[r.label] = summarise(r, samples[r.label], steps, flops, peak_flops, tokens)
        mem = r.memory(steps)
        results[r.label]["memory_bytes"] = mem
        results[r.label]["memory_kind"] = _memory_kind(r.label, device)
        results[r.label]["compile_s"] = getattr(r, "compile_s", None)
        if r.label in resolved:
            results[r.label]["attention"] = resolved[r.label]
    mhjax_labels = [r.label for r in runners if r.label not in TORCH_LABELS]
    best = max(mhjax_labels, key=lambda k: results[k]["member_steps_per_s"])
    ratios = {
        peer: results[best]["member_steps_per_s"] / results[peer]["member_steps_per_s"]
        for peer in TORCH_LABELS
        if peer in results
    }
    ratio = ratios.get("torch")

    print()
    print(
        f"Paper model, heads {'/'.join(map(str, HEADS))}, batch {config.data.batch_size}, "
        f"length {config.model.seq_len}: "
        f"{flops / 1e9:.2f} GFLOP per member-step (analytic)"
    )
    print(
        "fp32 matmul peak (2048^2, best of run): " + ", ".join(f"{k} {v / 1e9:.1f} GFLOP/s" for k, v in peaks.items())
    )
    header = (
        f"{'strategy':14s} {'member-steps/s':>14s} {'tokens/s':>10s} {'GFLOP/s':>8s} {'MFU':>6s} {'memory MB':>10s}"
        "   ms per member-step by heads"
    )
    print(header)
    print("-" * len(header))
    for label, r in results.items():
        mem = "-" if r["memory_bytes"] is None else f"{r['memory_bytes'] / 2**20:.0f}"
        by = ", ".join(f"{k}: {v:.0f}" for k, v in r["ms_per_step_by_heads"].items())
        print(
            f"{label:14s} {r['member_steps_per_s']:14.2f} {r['tokens_per_s']:10.0f} "
            f"{r['achieved_flops_per_s'] / 1e9:8.1f} "
            f"{r['mfu']:6.2f} {mem:>10s}   {by}"
        )
    if ratios:
        said = "; ".join(f"ratio_vs_{peer} = {value:.2f}" for peer, value in ratios.items())
        print(f"\nbest mhjax strategy: {best}; {said}; mfu = {results[best]['mfu']:.2f}")

    scaling = {}
    if not args.no_scaling:
        log(f"scaling: members per program {members_list} (vmapped, and unrolled) and lengths {lengths} (heads 4)")
        grouped = next((r for r in runners if r.label == "grouped"), None)
        reuse = grouped is not None and "h4" in grouped.program_heads
        scale_runners = []
        for n in members_list:
            if n == 1 and reuse:  # the grouped sweep's H=4 program is exactly this one
                r = ProgramView(grouped, "h4", "members=1")
            else:
                r = SweepRunner(make_config((4,), seeds=tuple(range(n))), f"members={n}")
                r.warm(steps)
            scale_runners.append(r)
            if n > 1:  # the same members, each unbatched (strategy unrolled)
                r = SweepRunner(make_config((4,), seeds=tuple(range(n)), strategy="unrolled"), f"unrolled={n}")
                r.warm(steps)
                scale_runners.append(r)
        for length in lengths:
            if length == config.model.seq_len and reuse:
                r = ProgramView(grouped, "h4", f"length={length}")
            else:
                r = SweepRunner(make_config((4,), length=length), f"length={length}")
                r.warm(steps)
            scale_runners.append(r)
        s_samples = interleaved(scale_runners, steps, reps, log)
        print(f"\n{'program':12s} {'member-steps/s':>14s} {'tokens/s':>10s} {'MFU':>6s} {'memory MB':>10s}")
        for r in scale_runners:
            length = r.config.model.seq_len
            out = summarise(
                r, s_samples[r.label], steps, model_flops(r.config), peak_flops, config.data.batch_size * length
            )
            out["memory_bytes"] = r.memory(steps)
            scaling[r.label] = out
            mem = "-" if out["memory_bytes"] is None else f"{out['memory_bytes'] / 2**20:.0f}"
            print(
                f"{r.label:12s} {out['member_steps_per_s']:14.2f} {out['tokens_per_s']:10.0f} "
                f"{out['mfu']:6.2f} {mem:>10s}"
            )

    payload = {
        "completed": True,
        "date": datetime.date.today().isoformat(),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "backend": backend,
            "jax": jax.__version__,
            "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        },
        "model": {
            "width": 64,
            "layers": 4,
            "mlp": 128,
            "vocab": 256,
            "batch": config.data.batch_size,
            "length": config.model.seq_len,
            "heads": list(HEADS),
            "dropout": config.model.dropout,
        },
        "cpu_attention_kernel": kernel,
        "attention": attention,
        "attention_resolved": resolved,
        "seeds": args.seeds,
        "torch_device": device,
        "torch_skipped": torch_skipped,
        "reps": reps,
        "steps_per_rep": steps,
        "flops_per_member_step": flops,
        "peak_flops_per_s": peaks,
        "peak_used": peak_flops,
        "torch_threads": torch_threads,
        "torch_thread_calibration_s": {str(k): v for k, v in torch_thread_times.items()},
        "strategies": results,
        "best_strategy": best,
        "ratio_vs_torch": ratio,
        "ratio_vs_torch_ensemble": ratios.get("torch_ensemble"),
        "mfu": results[best]["mfu"],
        "scaling": scaling,
        "wall_s": time.perf_counter() - t0,
    }
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2, default=float))
        log(f"wrote {args.json}")
    return payload


if __name__ == "__main__":
    main()
