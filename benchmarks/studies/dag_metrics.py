"""Exact DAG metrics vs the reference's per-walk Monte Carlo loop (speed case).

The set: 50 sequences x 4 layers x 8 models = 1,600 layer-sequences (T = 100),
i.e. the combined (learned-weight) attention operator of every layer of the
eight released checkpoints on 50 random sequences (seed 0). Without the
checkpoints (no /work/shared), 1,600 random causal softmax matrices are used.

Timed in one run:
  exact      mixing time (exact, reference chain, cap 100) + minimax fidelity
             (horizon 100, sink included) for all 1,600, jitted, after warm-up;
  exact+heads  the same plus every single head's fidelity (what `mhjax analyze`
             computes: best single head, synergy);
  mc         the vectorised seeded Monte Carlo (dag.mixing_time_mc, 500 walks per
             start node) on a subset, scaled to 1,600;
  reference  a plain Python per-walk loop (500 walks per start node, the
             reference sampler) + numpy matrix-power fidelity on a few
             layer-sequences of median mixing time (the loop's cost grows with
             the mixing time), its per-layer-sequence cost scaled to 1,600.
The ratio reference / exact is the headline (target >= 1000x).

    .venv/bin/python benchmarks/studies/dag_metrics.py [--ref-items 3] [--mc-items 16] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.analysis import dag
from mhjax.analysis.metrics import layer_metrics, learned_head_weights, random_tokens
from mhjax.models.model_config import ModelConfig
from mhjax.models.probe import forward_fn, model_sizes

CKPT = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "beyond_parallelism" / "checkpoints"
MODELS = [(h, task) for task in ("copy", "cycle") for h in (1, 4, 8, 16)]
NUM_SEQ, T, MAX_STEPS, HORIZON, WALKS = 50, 100, 100, 100, 500


# ------------------------------ inputs --------------------------------------
def checkpoint_attention(num_seq: int):
    """[(label, per-head attn (L, N, H, T, T), beta (L, H))] for the eight checkpoints."""
    from mhjax.io.torch_import import load_reference_params

    out = []
    tokens = random_tokens(num_seq, T, 256, 0)
    for h, task in MODELS:
        params, _ = load_reference_params(CKPT / f"{h}_heads_{task}.pt", h)
        s = model_sizes(params)
        fwd = forward_fn(ModelConfig.from_sizes(s), h)
        _, attn = fwd(jax.tree_util.tree_map(jnp.asarray, params), tokens)
        out.append((f"{h}_heads_{task}", attn, jnp.asarray(learned_head_weights(params, h))))
    return out


def random_attention(num_seq: int, seed: int = 0):
    """Same shapes from random causal softmax matrices (logits N(0, 3^2))."""
    rng = np.random.default_rng(seed)
    out = []
    mask = np.tril(np.ones((T, T), bool))
    for h, task in MODELS:
        logits = 3.0 * rng.standard_normal((4, num_seq, h, T, T)).astype(np.float32)
        logits = np.where(mask, logits, -np.inf)
        attn = np.exp(logits - logits.max(-1, keepdims=True))
        attn /= attn.sum(-1, keepdims=True)
        beta = rng.random((4, h)).astype(np.float32)
        out.append((f"random_{h}_heads_{task}", jnp.asarray(attn), jnp.asarray(beta / beta.sum(-1, keepdims=True))))
    return out


# ------------------------------ the methods ---------------------------------
@partial(jax.jit, static_argnames=("block",))
def exact_metrics(A, block: int = 8):
    """A (n, T, T), n % block == 0 -> (mixing time, minimax fidelity) each (n,)."""
    blocks = A.reshape(-1, block, *A.shape[-2:])
    mix, fid = jax.lax.map(
        lambda a: (dag.mixing_time(a, MAX_STEPS, "reference"), dag.minimax_fidelity(a, HORIZON, True)), blocks
    )
    return mix.reshape(-1), fid.reshape(-1)


def reference_mixing_loop(A: np.ndarray, rng, num_walks: int = WALKS, max_steps: int = MAX_STEPS) -> float:
    """The reference method, literally: per start node, per walk, step by step in Python.

    Next node from the UNNORMALISED column of A for the current node i:
    c_k = min(1, cumsum_k A[k, i]); next = first k with c_k > u (else the sink).
    """
    T_ = A.shape[0]
    sink = T_ - 1
    total = 0
    for start in range(T_):
        for _ in range(num_walks):
            node, steps = start, 0
            while node != sink and steps < max_steps:
                c = np.minimum(1.0, np.cumsum(A[:, node]))
                node = min(int(np.searchsorted(c, rng.random(), side="right")), sink)
                steps += 1
            total += steps
    return total / (T_ * num_walks)


def reference_fidelity(A: np.ndarray, horizon: int = HORIZON) -> float:
    """Matrix powers A^t, t = 1..horizon, max of the sink row, min over all nodes."""
    P, best = np.eye(A.shape[0]), None
    for _ in range(horizon):
        P = P @ A
        row = P[-1]
        best = row if best is None else np.maximum(best, row)
    return float(best.min())


def _time(fn, repeats: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ap.add_argument("--ref-items", type=int, default=3, help="layer-sequences run through the Python reference loop")
    ap.add_argument("--mc-items", type=int, default=16, help="layer-sequences for the vectorised MC (500 walks)")
    ap.add_argument("--random", action="store_true", help="use random causal matrices even if checkpoints exist")
    ap.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = ap.parse_args(argv)

    use_ckpt = CKPT.is_dir() and not args.random
    models = checkpoint_attention(NUM_SEQ) if use_ckpt else random_attention(NUM_SEQ)
    combined = jnp.concatenate([dag.combine(attn, beta[:, None, :]).reshape(-1, T, T) for _, attn, beta in models])
    combined = jax.block_until_ready(combined)
    n = combined.shape[0]
    source = "released checkpoints (50 random sequences, seed 0)" if use_ckpt else "random causal softmax matrices"
    print(f"backend {jax.default_backend()}, {os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}")
    print(f"set: {n} layer-sequences (8 models x 4 layers x {NUM_SEQ} sequences, T={T}) from {source}")

    # exact: compile once, then best of 3
    t0 = time.perf_counter()
    jax.block_until_ready(exact_metrics(combined))
    compile_s = time.perf_counter() - t0
    exact_s, (mix, fid) = _time(lambda: exact_metrics(combined))
    mix, fid = np.asarray(mix), np.asarray(fid)

    # the analysis path: + every single head's fidelity (best single head / synergy)
    def full():
        return [layer_metrics(attn, beta) for _, attn, beta in models]

    jax.block_until_ready(full())
    full_s, _ = _time(full, repeats=2)

    # vectorised Monte Carlo, 500 walks per start node, on a subset
    k = min(args.mc_items, n)
    sub = combined[:k]
    mc = jax.jit(
        lambda key, a: jax.lax.map(lambda x: dag.mixing_time_mc(key, x[None], MAX_STEPS, WALKS, "reference", True), a)
    )
    jax.block_until_ready(mc(jax.random.PRNGKey(0), sub))
    mc_s, (mc_est, mc_se) = _time(lambda: mc(jax.random.PRNGKey(1), sub), repeats=1)
    mc_est, mc_se = np.asarray(mc_est).reshape(-1), np.asarray(mc_se).reshape(-1)
    mc_scaled = mc_s / k * n

    # the reference Python loop on a few layer-sequences
    r = min(args.ref_items, n)
    rng = np.random.default_rng(0)
    # representative items: those whose exact mixing time is closest to the set's median
    # (the loop's cost is proportional to the number of walk steps, i.e. to the mixing time)
    pick = np.sort(np.argsort(np.abs(mix - np.median(mix)))[:r])
    ref_mix, ref_mix_s, ref_fid_s = [], 0.0, 0.0
    host = np.asarray(combined, np.float64)
    for i in pick:
        t0 = time.perf_counter()
        ref_mix.append(reference_mixing_loop(host[i], rng))
        ref_mix_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        reference_fidelity(host[i])
        ref_fid_s += time.perf_counter() - t0
    ref_per = (ref_mix_s + ref_fid_s) / r
    ref_scaled = ref_per * n
    # alternative extrapolation: Python cost per walk step x the set's exact expected walk steps
    per_step = ref_mix_s / (np.sum(mix[pick]) * T * WALKS)
    ref_step_weighted = float(per_step * np.sum(mix) * T * WALKS + ref_fid_s / r * n)
    ratio = ref_scaled / exact_s

    rows = [
        ("exact (mixing + fidelity)", exact_s, exact_s / n, n),
        ("exact + every head (analyze)", full_s, full_s / n, n),
        (f"vectorised MC ({WALKS} walks)", mc_scaled, mc_s / k, k),
        (f"reference Python loop ({WALKS} walks)", ref_scaled, ref_per, r),
    ]
    print(f"\n{'method':<38}{'time for set (s)':>18}{'per layer-seq (ms)':>20}{'measured on':>13}")
    for name, total, per, on in rows:
        print(f"{name:<38}{total:>18.3f}{1e3 * per:>20.3f}{on:>13}")
    print(
        f"(exact first call incl. compile: {compile_s:.2f} s; reference loop split: "
        f"MC {ref_mix_s / r:.3f} s + fidelity {ref_fid_s / r:.4f} s per layer-sequence)"
    )
    print(
        f"(reference extrapolated by walk steps instead, using the exact mixing times of all {n}: "
        f"{ref_step_weighted:,.0f} s, i.e. {ref_step_weighted / exact_s:,.0f}x; the headline uses the per-item cost)"
    )
    print(
        f"\nspeed-up exact vs reference loop: {ratio:,.0f}x  (target >= 1000x: {'PASS' if ratio >= 1000 else 'FAIL'})"
    )
    print(f"speed-up exact vs vectorised MC:  {mc_scaled / exact_s:,.0f}x")
    print("\nagreement on the measured items (exact vs MC estimates):")
    for j, i in enumerate(pick):
        print(f"  item {i:5d}: exact {mix[i]:.4f}  reference loop {ref_mix[j]:.4f}")
    z = np.abs(mc_est - mix[:k]) / np.maximum(mc_se, 1e-12)
    print(
        f"  vectorised MC on {k} items: max |MC - exact| = {np.max(np.abs(mc_est - mix[:k])):.4f} "
        f"({np.max(z):.2f} standard errors)"
    )
    if use_ckpt:
        per_layer = mix.reshape(8, 4, NUM_SEQ).mean(-1)
        print("\nmean exact mixing time per (model, layer):")
        for (h, task), vals in zip(MODELS, per_layer):
            print(f"  {h:>2}_heads_{task:<5} " + "  ".join(f"L{l} {v:8.4f}" for l, v in enumerate(vals)))

    result = {
        "set": {
            "layer_sequences": n,
            "T": T,
            "source": source,
            "backend": jax.default_backend(),
            "cpu_count": os.cpu_count(),
        },
        "exact_s": exact_s,
        "exact_compile_s": compile_s,
        "exact_plus_heads_s": full_s,
        "mc_s_scaled": mc_scaled,
        "mc_items": k,
        "mc_walks": WALKS,
        "reference_s_per_item": ref_per,
        "reference_s_scaled": ref_scaled,
        "reference_items": r,
        "reference_mixing_s_per_item": ref_mix_s / r,
        "reference_fidelity_s_per_item": ref_fid_s / r,
        "reference_s_step_weighted": ref_step_weighted,
        "median_mixing_time": float(np.median(mix)),
        "ratio_reference_over_exact": ratio,
        "ratio_mc_over_exact": mc_scaled / exact_s,
        "target_ratio": 1000,
        "pass": bool(ratio >= 1000),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2, default=float))
    return result


if __name__ == "__main__":
    main()
