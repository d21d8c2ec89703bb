"""`mhjax analyze`: DAG metrics of trained models' attention (spec §2-3, §5 evaluation).

For every layer and every evaluation sequence we take the H per-head causal
attention matrices (eval mode, no dropout), combine them with the LEARNED head
weights of that layer (Frobenius norms of the row blocks of ``attn.out.kernel``),
and compute, with the reference conventions by default:

* mixing time: exact expected hitting time of the sink under the reference chain,
  capped at ``max_steps = 100`` (:func:`mhjax.analysis.dag.mixing_time`);
* minimax fidelity in percent, horizon 100, min over all T nodes including the
  sink (``include_sink=True``);
* the best single head's minimax fidelity and whether the combination beats it.

All layers x sequences x heads go through one jitted function per model shape.
Results are per layer: mean and (population, ddof=0) std over sequences.
Layers are numbered from 0.

Bad input raises :class:`mhjax.config.ConfigError` with a one-line message that
names the offending option.
"""
from __future__ import annotations

import json
import math
import os
import re
from functools import lru_cache, partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.analysis import dag
from mhjax.config import ConfigError
from mhjax.data import sequences as seqdata

__all__ = [
    "DEFAULTS",
    "layer_metrics",
    "learned_head_weights",
    "model_sizes",
    "predict",
    "member_params",
    "analyze_params",
    "analyze_torch_checkpoint",
    "analyze_workdir",
    "load_sequences",
    "random_tokens",
    "attention_grid",
    "write_analysis",
    "format_analysis",
]

# Reference conventions (spec §2-3): learned weights, sink included, horizon 100,
# mixing capped at 100 steps on the reference (unnormalised-column) chain.
DEFAULTS = {"horizon": 100, "max_steps": 100, "include_sink": True, "chain": "reference"}
_CHAINS = ("reference", "normalized")


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


# --------------------------------------------------------------------------- #
# The metrics, batched over layers x sequences
# --------------------------------------------------------------------------- #
def _metrics_block(attn, beta, horizon, max_steps, include_sink, chain):
    """attn (n, H, T, T), beta (n, H) -> dict of (n,) arrays."""
    combined = dag.combine(attn, beta)
    fid = dag.minimax_fidelity(combined, horizon, include_sink)
    per_head = dag.minimax_fidelity(attn, horizon, include_sink)  # (n, H)
    best = jnp.max(per_head, axis=-1)
    return {
        "mixing_time": dag.mixing_time(combined, max_steps, chain),
        "fidelity": fid,
        "best_single": best,
        "beats": fid > best,
    }


@partial(jax.jit, static_argnames=("horizon", "max_steps", "include_sink", "chain", "block"))
def layer_metrics(attn, beta, horizon: int = 100, max_steps: int = 100, include_sink: bool = True,
                  chain: str = "reference", block: int = 8):
    """Per-layer, per-sequence metrics: attn ``(L, N, H, T, T)``, beta ``(L, H)``.

    Returns a dict of ``(L, N)`` arrays: ``mixing_time`` (steps), ``fidelity``
    and ``best_single`` (fractions), ``beats`` (bool, combined > best single head).

    The L*N matrices are processed ``block`` at a time (``lax.map``) so each
    block's 100 matrix-vector steps run out of cache instead of streaming the
    whole stack from memory once per step; on CPU that is several times faster.
    """
    L, N, H, T, _ = attn.shape
    flat = attn.reshape(L * N, H, T, T)
    betas = jnp.broadcast_to(beta[:, None, :], (L, N, H)).reshape(L * N, H)
    n = L * N
    block = max(1, min(block, n))
    pad = (-n) % block
    if pad:
        flat = jnp.concatenate([flat, jnp.broadcast_to(flat[:1], (pad, H, T, T))])
        betas = jnp.concatenate([betas, jnp.broadcast_to(betas[:1], (pad, H))])
    fn = partial(_metrics_block, horizon=horizon, max_steps=max_steps, include_sink=include_sink, chain=chain)
    out = jax.lax.map(lambda xb: fn(*xb), (flat.reshape(-1, block, H, T, T), betas.reshape(-1, block, H)))
    return {k: v.reshape(-1)[:n].reshape(L, N) for k, v in out.items()}


def model_sizes(params) -> dict[str, int]:
    """vocab_size, max_len, width, num_layers, mlp_dim read off a Transformer param tree."""
    try:
        vocab, width = np.shape(params["token_emb"]["embedding"])
        max_len = np.shape(params["pos_emb"]["embedding"])[0]
        num_layers = sum(1 for k in params if re.fullmatch(r"block_\d+", k))
        mlp_dim = np.shape(params["block_0"]["mlp_in"]["kernel"])[1]
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise ConfigError(f"params: not a mhjax Transformer parameter tree ({type(exc).__name__}: {exc})") from None
    return {"vocab_size": int(vocab), "max_len": int(max_len), "width": int(width),
            "num_layers": int(num_layers), "mlp_dim": int(mlp_dim)}


def learned_head_weights(params, heads: int) -> np.ndarray:
    """(L, H) learned head weights of every layer from ``block_l/attn/out/kernel``."""
    L = model_sizes(params)["num_layers"]
    kernels = jnp.stack([jnp.asarray(params[f"block_{l}"]["attn"]["out"]["kernel"]) for l in range(L)])
    return np.asarray(dag.head_weights("learned", heads, out_kernel=kernels))


@lru_cache(maxsize=32)
def _forward_fn(vocab_size, max_len, width, num_layers, mlp_dim, heads):
    """jit(params, tokens (B, T)) -> (predictions (B, T) int32, attention (L, B, H, T, T))."""
    from mhjax.models.transformer import Transformer

    model = Transformer(vocab_size, max_len, width, num_layers, mlp_dim, heads, 0.0)

    @jax.jit
    def forward(params, tokens):
        logits, attn = model.apply({"params": params}, tokens, return_attention=True)
        return jnp.argmax(logits, axis=-1).astype(jnp.int32), jnp.stack(attn)

    return forward


def predict(params, heads: int, tokens, sizes: dict | None = None):
    """Eval-mode forward of the plain H-head model: tokens (B, T) -> (argmax predictions (B, T),
    attention (L, B, H, T, T)) as numpy arrays."""
    sizes = sizes or model_sizes(params)
    fwd = _forward_fn(sizes["vocab_size"], sizes["max_len"], sizes["width"], sizes["num_layers"], sizes["mlp_dim"], int(heads))
    preds, attn = fwd(jax.tree_util.tree_map(jnp.asarray, params), jnp.asarray(tokens, jnp.int32))
    return np.asarray(preds), np.asarray(attn)


def random_tokens(num: int, length: int, vocab_size: int, seed: int = 0) -> np.ndarray:
    """(num, length) int32 uniform random tokens from ``PRNGKey(seed)``."""
    if isinstance(num, bool) or not isinstance(num, (int, np.integer)) or num <= 0:
        raise ConfigError(f"--num-sequences: must be a positive integer, got {num!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"--seed: must be a non-negative integer, got {seed!r}")
    return np.asarray(seqdata.random_sequences(jax.random.PRNGKey(int(seed)), int(num), length, vocab_size))


def load_sequences(path, max_len: int, vocab_size: int) -> np.ndarray:
    """Read ``--sequences FILE.npy``: an integer array (N, T), 2 <= T <= max_len, tokens in [0, vocab)."""
    path = str(path)
    if not os.path.isfile(path):
        raise ConfigError(f"--sequences: no such file: {path}")
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as exc:  # not an .npy, pickled object array, truncated ...
        raise ConfigError(f"--sequences: {path} is not a readable .npy array ({type(exc).__name__}: {_one_line(exc)[:200]})") from None
    if not isinstance(arr, np.ndarray):
        raise ConfigError(f"--sequences: {path} must hold a single array (an .npy file), not an archive")
    if arr.ndim != 2 or arr.shape[0] < 1:
        raise ConfigError(f"--sequences: expected an (N, T) array with N >= 1, got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.integer) and not np.issubdtype(arr.dtype, np.bool_)):
        raise ConfigError(f"--sequences: expected an integer dtype, got {arr.dtype}")
    if not 2 <= arr.shape[1] <= max_len:
        raise ConfigError(f"--sequences: sequence length T={arr.shape[1]} must be in [2, {max_len}] (the model's max_len)")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        raise ConfigError(f"--sequences: tokens must be in [0, {vocab_size - 1}], found values in [{lo}, {hi}]")
    return arr.astype(np.int32)


def _check_task(task: str) -> int:
    if task not in seqdata.TASKS:
        raise ConfigError(f"--task: must be one of {', '.join(seqdata.TASKS)}; got {task!r}")
    return seqdata.TASKS.index(task)


def _check_conventions(horizon, max_steps, include_sink, chain) -> dict:
    for name, value in (("--horizon", horizon), ("--max-steps", max_steps)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(f"{name}: must be a positive integer, got {value!r}")
    if chain not in _CHAINS:
        raise ConfigError(f"--chain: must be one of {', '.join(_CHAINS)}; got {chain!r}")
    return {"head_weights": "learned", "horizon": int(horizon), "max_steps": int(max_steps),
            "include_sink": bool(include_sink), "chain": chain, "fidelity_unit": "percent",
            "std": "population (ddof=0) over sequences", "layers_numbered_from": 0}


def analyze_params(params, heads: int, task: str, tokens, sizes: dict | None = None, *,
                   horizon: int = 100, max_steps: int = 100, include_sink: bool = True,
                   chain: str = "reference", batch_size: int = 50, keep_attention: bool = False,
                   block: int = 8) -> dict:
    """Accuracy and per-layer DAG metrics of one H-head Transformer.

    Args:
      params: Flax param tree of :class:`mhjax.models.transformer.Transformer`.
      heads: H (the plain H-head model is run).
      task: one of ``copy``, ``cycle``, ``zero`` (targets from
        :func:`mhjax.data.sequences.targets_for`).
      tokens: (N, T) int sequences.
      sizes: model sizes; read off ``params`` when None (:func:`model_sizes`).
      batch_size: sequences per forward/metrics call (bounds memory).
      keep_attention: also return ``attention`` (L, H, T, T) and ``combined``
        (L, T, T) numpy arrays of sequence 0 (for heatmaps; not JSON-serialisable).

    Returns a JSON-ready dict: ``accuracy`` (token accuracy over all positions),
    ``accuracy_excluding_first`` (positions 1..T-1), ``layers`` (one dict per
    layer with ``layer``, ``mixing_time_mean/std``, ``fidelity_pct_mean/std``,
    ``best_single_fidelity_pct_mean/std``, ``combined_beats_best_share``,
    ``head_weights``), and the conventions used.
    """
    task_id = _check_task(task)
    conventions = _check_conventions(horizon, max_steps, include_sink, chain)
    sizes = dict(sizes or model_sizes(params))
    if isinstance(heads, bool) or not isinstance(heads, (int, np.integer)) or heads < 1 or sizes["width"] % heads:
        raise ConfigError(f"--heads: must be a positive divisor of the model width {sizes['width']}, got {heads!r}")
    heads = int(heads)
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or not 2 <= tokens.shape[1] <= sizes["max_len"]:
        raise ConfigError(f"--sequences: expected (N, T) tokens with 2 <= T <= {sizes['max_len']}, got shape {tokens.shape}")
    tokens = tokens.astype(np.int32)
    N, T = tokens.shape
    targets = np.asarray(seqdata.targets_for(task_id, tokens))
    forward = _forward_fn(sizes["vocab_size"], sizes["max_len"], sizes["width"], sizes["num_layers"],
                          sizes["mlp_dim"], heads)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    beta = jnp.asarray(learned_head_weights(params, heads))  # (L, H)

    bs = max(1, min(int(batch_size), N))
    correct = np.zeros((N, T), bool)
    parts: dict[str, list] = {}
    example = None
    for start in range(0, N, bs):
        chunk = tokens[start:start + bs]
        n = chunk.shape[0]
        if n < bs:  # pad the tail so every call has one shape (one compile)
            chunk = np.concatenate([chunk, np.repeat(chunk[:1], bs - n, axis=0)])
        preds, attn = forward(params, chunk)
        correct[start:start + n] = np.asarray(preds)[:n] == targets[start:start + n]
        if keep_attention and example is None:
            example = np.asarray(attn[:, 0])
        m = jax.device_get(layer_metrics(attn, beta, horizon=horizon, max_steps=max_steps,
                                         include_sink=include_sink, chain=chain, block=block))
        for k, v in m.items():
            parts.setdefault(k, []).append(np.asarray(v)[:, :n])
    per = {k: np.concatenate(v, axis=1) for k, v in parts.items()}  # (L, N)
    beta_np = np.asarray(beta)
    layers = []
    for l in range(sizes["num_layers"]):
        mix, fid, best = per["mixing_time"][l].astype(np.float64), 100.0 * per["fidelity"][l].astype(np.float64), \
            100.0 * per["best_single"][l].astype(np.float64)
        layers.append({
            "layer": l,
            "mixing_time_mean": float(mix.mean()),
            "mixing_time_std": float(mix.std()),
            "fidelity_pct_mean": float(fid.mean()),
            "fidelity_pct_std": float(fid.std()),
            "best_single_fidelity_pct_mean": float(best.mean()),
            "best_single_fidelity_pct_std": float(best.std()),
            "combined_beats_best_share": float(per["beats"][l].mean()),
            "head_weights": [float(b) for b in beta_np[l]],
        })
    result = {
        "heads": heads,
        "task": task,
        "num_sequences": int(N),
        "seq_len": int(T),
        "accuracy": float(correct.mean()),
        "accuracy_excluding_first": float(correct[:, 1:].mean()),
        "conventions": conventions,
        "model": sizes,
        "layers": layers,
    }
    if keep_attention:
        result["attention"] = example  # (L, H, T, T)
        result["combined"] = np.einsum("lh,lhij->lij", beta_np, example)
    return result


# --------------------------------------------------------------------------- #
# Sources: a reference torch checkpoint, a trained sweep workdir
# --------------------------------------------------------------------------- #
def _tokens_for(sequences, num_sequences, seed, max_len, vocab_size) -> tuple[np.ndarray, dict]:
    if sequences is not None:
        if isinstance(sequences, (str, os.PathLike)):
            tokens = load_sequences(sequences, max_len, vocab_size)
            return tokens, {"sequences": str(sequences)}
        tokens = np.asarray(sequences)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer) or tokens.size == 0:
            raise ConfigError(f"--sequences: expected a non-empty (N, T) integer array, got shape {tokens.shape} dtype {tokens.dtype}")
        if not 2 <= tokens.shape[1] <= max_len or tokens.min() < 0 or tokens.max() >= vocab_size:
            raise ConfigError(f"--sequences: need 2 <= T <= {max_len} and tokens in [0, {vocab_size - 1}]")
        return tokens.astype(np.int32), {"sequences": "array"}
    return random_tokens(num_sequences, max_len, vocab_size, seed), {"sequences": "random", "seed": int(seed)}


def analyze_torch_checkpoint(path, heads: int, task: str, out=None, sequences=None, num_sequences: int = 50,
                             seed: int = 0, *, plot: bool = True, **kwargs) -> dict:
    """Analyse one reference ``{H}_heads_{task}.pt`` file; writes ``out/analysis.{json,md,png}`` if ``out``.

    ``sequences``: None (``num_sequences`` random sequences of the model's
    max_len from ``seed``), a path to an ``.npy`` (N, T) int array, or an array.
    Extra keyword arguments go to :func:`analyze_params`.
    """
    from mhjax.io.torch_import import CheckpointFormatError, UnsafeCheckpointError, load_reference_params

    _check_task(task)
    path = str(path)
    if not os.path.isfile(path):
        raise ConfigError(f"--torch-checkpoint: no such file: {path}")
    if isinstance(heads, bool) or not isinstance(heads, (int, np.integer)) or heads < 1:
        raise ConfigError(f"--heads: must be a positive integer, got {heads!r}")
    try:
        params, info = load_reference_params(path, num_heads=int(heads))
    except (CheckpointFormatError, UnsafeCheckpointError) as exc:
        option = "--heads" if "num_heads" in str(exc) else "--torch-checkpoint"
        raise ConfigError(f"{option}: {_one_line(exc)}") from None
    sizes = {k: info[k] for k in ("vocab_size", "max_len", "num_layers", "mlp_dim")}
    sizes["width"] = info["d_model"]
    tokens, source = _tokens_for(sequences, num_sequences, seed, sizes["max_len"], sizes["vocab_size"])
    result = analyze_params(params, int(heads), task, tokens, sizes, **kwargs)
    result = {"source": {"torch_checkpoint": os.path.abspath(path), **source}, **result}
    if out is not None:
        result["files"] = write_analysis(out, result, plot=plot)
    return result


def _workdir_sweep(workdir: str):
    """(experiment, Sweep, latest step, states) restored from a trained sweep workdir."""
    import ml_collections

    from mhjax.experiments import make_experiment
    from mhjax.io.checkpoint import METADATA, SweepCheckpointer
    from mhjax.train.loop import Sweep

    from mhjax.io.results import read_workdir_json

    meta = read_workdir_json(workdir, METADATA, "not a mhjax sweep workdir")
    try:
        config = ml_collections.ConfigDict(meta["config"])
    except (KeyError, TypeError, AttributeError) as exc:
        raise ConfigError(f"--workdir: {os.path.join(workdir, METADATA)} is unreadable ({type(exc).__name__})") from None
    experiment = make_experiment(config)
    if experiment.kind != "sequence":
        raise ConfigError(f"--workdir: analyze needs a sequence (copy/cycle/zero) sweep; {workdir} holds a {experiment.kind!r} sweep")
    if not os.path.isdir(os.path.join(workdir, "checkpoints")):
        raise ConfigError(f"--workdir: {workdir} has no checkpoints/; train it first")
    checkpointer = SweepCheckpointer(workdir)
    try:
        step = checkpointer.latest_step()
        if step is None:
            raise ConfigError(f"--workdir: {workdir} has no checkpoint yet; train it first")
        sweep = Sweep(experiment)
        states, _ = sweep.restore(checkpointer, step)
        return experiment, sweep, step, states
    except ConfigError as exc:
        raise ConfigError(f"--workdir: {_one_line(exc)}") from None
    finally:
        checkpointer.close()


def member_params(sweep, states) -> dict[int, Any]:
    """Member index -> its own (unstacked) param tree: position j of its program's leading axis."""
    out = {}
    for name, idx, _ in sweep.programs:
        params = states[name].params
        for j, i in enumerate(idx):
            out[i] = jax.tree_util.tree_map(lambda x, j=j: np.asarray(x[j]), params)
    return out


def analyze_workdir(workdir, out=None, sequences=None, num_sequences: int = 50, seed: int = 0, *,
                    tensorboard: bool = True, plot: bool = True, log=None, **kwargs) -> dict:
    """Analyse every member of a trained sequence sweep (latest checkpoint).

    Writes ``out/analysis.{json,md,png}`` (default ``out = W/analysis``) with one
    object per member under ``"members"`` (keyed by member name), and, unless
    ``tensorboard=False``, logs ``analysis/...`` scalars and per-layer attention
    heatmaps (all heads + the combined operator, evaluation sequence 0) to each
    member's run ``W/tb/<member>`` at the checkpoint's step.
    """
    workdir = str(workdir)
    experiment, sweep, step, states = _workdir_sweep(workdir)
    m = experiment.config.model
    tokens, source = _tokens_for(sequences, num_sequences, seed, m.seq_len, m.vocab_size)
    sizes = {"vocab_size": m.vocab_size, "max_len": m.seq_len, "width": m.width,
             "num_layers": m.num_layers, "mlp_dim": m.mlp_dim}
    all_params = member_params(sweep, states)
    diverged = {}
    for name, idx, _ in sweep.programs:
        flags = np.asarray(jax.device_get(states[name].diverged))
        for j, i in enumerate(idx):
            diverged[i] = bool(flags[j])
    members = {}
    writer_cls = None
    if tensorboard:
        from tensorboardX import SummaryWriter as writer_cls
    for i, member in enumerate(experiment.members):
        res = analyze_params(all_params[i], member["heads"], member["task"], tokens, sizes,
                             keep_attention=tensorboard, **kwargs)
        attention, combined = res.pop("attention", None), res.pop("combined", None)
        entry = {"name": member.name, **{k: v for k, v in member.hparams.items()},
                 "status": "diverged" if diverged[i] else "ok", **res}
        members[member.name] = entry
        if log is not None:
            log(f"{member.name}: accuracy {res['accuracy']:.4f}")
        if tensorboard:
            writer = writer_cls(os.path.join(workdir, "tb", member.name), flush_secs=30)
            try:
                log_to_tensorboard(writer, entry, attention, combined, step)
            finally:
                writer.close()
    result = {
        "workdir": os.path.abspath(workdir),
        "step": int(step),
        "source": source,
        "conventions": next(iter(members.values()))["conventions"] if members else None,
        "members": members,
    }
    out = os.path.join(workdir, "analysis") if out is None else str(out)
    result["files"] = write_analysis(out, result, plot=plot)
    return result


# --------------------------------------------------------------------------- #
# TensorBoard
# --------------------------------------------------------------------------- #
def attention_grid(attention: np.ndarray, combined: np.ndarray | None = None, gamma: float = 0.5,
                   min_panel: int = 64) -> np.ndarray:
    """One RGB uint8 image (HWC): a panel per head (H, T, T) plus the combined operator.

    Values in [0, 1] are shown as ``value ** gamma`` (gamma 0.5 makes small weights
    visible) through the viridis colour map; panels are separated by white lines and
    upscaled (nearest) to at least ``min_panel`` pixels.
    """
    from matplotlib import colormaps

    panels = [np.asarray(a, np.float64) for a in attention]
    if combined is not None:
        panels.append(np.asarray(combined, np.float64))
    T = panels[0].shape[-1]
    scale = max(1, math.ceil(min_panel / T))
    cols = math.ceil(math.sqrt(len(panels)))
    rows = math.ceil(len(panels) / cols)
    size, gap = T * scale, 2
    canvas = np.ones((rows * size + (rows - 1) * gap, cols * size + (cols - 1) * gap, 3))
    cmap = colormaps["viridis"]
    for n, p in enumerate(panels):
        r, c = divmod(n, cols)
        rgb = cmap(np.clip(p, 0.0, 1.0) ** gamma)[..., :3]
        rgb = np.repeat(np.repeat(rgb, scale, axis=0), scale, axis=1)
        canvas[r * (size + gap):r * (size + gap) + size, c * (size + gap):c * (size + gap) + size] = rgb
    return (canvas * 255).round().astype(np.uint8)


def log_to_tensorboard(writer, entry: dict, attention, combined, step: int) -> None:
    """Scalars ``analysis/accuracy``, ``analysis/layer{l}/...`` and heatmaps ``analysis/attention/layer{l}``."""
    writer.add_scalar("analysis/accuracy", entry["accuracy"], step)
    writer.add_scalar("analysis/accuracy_excluding_first", entry["accuracy_excluding_first"], step)
    for layer in entry["layers"]:
        l = layer["layer"]
        for key, tag in (("mixing_time_mean", "mixing_time"), ("mixing_time_std", "mixing_time_std"),
                         ("fidelity_pct_mean", "fidelity_pct"), ("fidelity_pct_std", "fidelity_pct_std"),
                         ("best_single_fidelity_pct_mean", "best_single_fidelity_pct"),
                         ("combined_beats_best_share", "combined_beats_best_share")):
            writer.add_scalar(f"analysis/layer{l}/{tag}", layer[key], step)
        if attention is not None:
            img = attention_grid(attention[l], None if combined is None else combined[l])
            writer.add_image(f"analysis/attention/layer{l}", img, step, dataformats="HWC")
    writer.flush()


# --------------------------------------------------------------------------- #
# Writers
# --------------------------------------------------------------------------- #
def _entries(result: dict) -> list[tuple[str, dict]]:
    if "members" in result:
        return list(result["members"].items())
    label = f"{result.get('heads')} heads, {result.get('task')}"
    return [(label, result)]


def _clean(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.generic):
        return _clean(value.item())
    return value


def format_analysis(result: dict) -> str:
    """Markdown: accuracy and a per-layer table for each analysed model."""
    conv = result.get("conventions") or {}
    lines = ["# mhjax analyze", ""]
    if "workdir" in result:
        lines.append(f"Sweep `{result['workdir']}` at step {result['step']}.")
    elif "source" in result:
        lines.append(f"Checkpoint `{result['source'].get('torch_checkpoint')}`.")
    lines += [
        "",
        f"Learned head weights; fidelity = minimax fidelity in percent (horizon {conv.get('horizon')}, "
        f"include_sink={conv.get('include_sink')}); mixing time = exact expected steps to the sink "
        f"({conv.get('chain')} chain, capped at {conv.get('max_steps')}). Mean ± std over sequences; layers from 0.",
        "",
    ]
    for label, e in _entries(result):
        status = f", status {e['status']}" if e.get("status", "ok") != "ok" else ""
        lines += [
            f"## {label}",
            "",
            f"{e['heads']} heads, task {e['task']}, {e['num_sequences']} sequences of length {e['seq_len']}{status}. "
            f"Token accuracy {100 * e['accuracy']:.2f}% ({100 * e['accuracy_excluding_first']:.2f}% excluding position 0).",
            "",
            "| layer | mixing time | fidelity % | best single head % | combined > best | head weights |",
            "|---:|---:|---:|---:|---:|:---|",
        ]
        for layer in e["layers"]:
            weights = ", ".join(f"{w:.3f}" for w in layer["head_weights"])
            lines.append(
                f"| {layer['layer']} | {layer['mixing_time_mean']:.4f} ± {layer['mixing_time_std']:.4f} "
                f"| {layer['fidelity_pct_mean']:.3f} ± {layer['fidelity_pct_std']:.3f} "
                f"| {layer['best_single_fidelity_pct_mean']:.3f} "
                f"| {100 * layer['combined_beats_best_share']:.0f}% | {weights} |"
            )
        lines.append("")
    return "\n".join(lines)


def _plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    entries = _entries(result)
    fig, (ax_mix, ax_fid) = plt.subplots(1, 2, figsize=(11, 4.2))
    n = len(entries)
    width = 0.6 / max(n, 1)
    for k, (label, e) in enumerate(entries):
        x = np.array([layer["layer"] for layer in e["layers"]], float) + (k - (n - 1) / 2) * width
        mix = [layer["mixing_time_mean"] for layer in e["layers"]]
        mix_sd = [layer["mixing_time_std"] for layer in e["layers"]]
        fid = [layer["fidelity_pct_mean"] for layer in e["layers"]]
        fid_sd = [layer["fidelity_pct_std"] for layer in e["layers"]]
        ax_mix.errorbar(x, mix, yerr=mix_sd, marker="o", capsize=3, label=label)
        ax_fid.errorbar(x, fid, yerr=fid_sd, marker="o", capsize=3, label=label)
    ax_mix.set(xlabel="layer", ylabel="mixing time (steps to sink)", title="Mixing time (mean ± std)")
    ax_fid.set(xlabel="layer", ylabel="minimax fidelity (%)", title="Minimax fidelity (mean ± std)")
    for ax in (ax_mix, ax_fid):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    ax_fid.legend(fontsize="small", loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_analysis(out, result: dict, plot: bool = True) -> dict[str, str]:
    """Write ``analysis.json``, ``analysis.md`` and (``plot``) ``analysis.png`` under ``out``."""
    out = Path(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--out: cannot create {out} ({type(exc).__name__}: {_one_line(exc)})") from None
    files = {"json": str(out / "analysis.json"), "md": str(out / "analysis.md")}
    if plot:
        files["png"] = str(out / "analysis.png")
    payload = _clean({k: v for k, v in result.items() if k != "files"})
    payload["files"] = files
    tmp = out / "analysis.json.tmp"
    tmp.write_text(json.dumps(payload, indent=2))
    os.replace(tmp, out / "analysis.json")
    (out / "analysis.md").write_text(format_analysis(result))
    if plot:
        _plot(result, files["png"])
    return files
