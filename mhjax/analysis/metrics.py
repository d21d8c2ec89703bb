"""DAG metrics of a trained Transformer's attention (mixing time, minimax fidelity, synergy).

For every layer and every evaluation sequence we take the H per-head causal attention
matrices (eval mode, no dropout), combine them with the LEARNED head weights of that layer
(Frobenius norms of the row blocks of ``attn.out.kernel``), and compute, with the reference
conventions of "Beyond Parallelism: Synergistic Computational Graph Effects in Multi-Head
Attention" (arXiv 2507.02944, Sections 3-4) by default:

* mixing time: exact expected hitting time of the sink under the reference chain, capped at
  ``max_steps = 100`` (:func:`mhjax.analysis.dag.mixing_time`);
* minimax fidelity in percent, horizon 100, min over all T nodes including the sink
  (``include_sink=True``);
* the best single head's minimax fidelity and whether the combination beats it.

All layers x sequences x heads go through one jitted function per model shape. Results are
per layer: mean and (population, ddof=0) std over sequences; layers are numbered from 0. Bad
input raises :class:`mhjax.config.ConfigError` with a one-line message naming the option.
"""

from __future__ import annotations

import dataclasses
import os
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.analysis import ablation, dag, rollout
from mhjax.analysis.records import AnalysisOptions, LayerAnalysis, MemberAnalysis
from mhjax.config import ConfigError
from mhjax.data import sequences as seqdata
from mhjax.data.tasks import Batch, Task, get_task
from mhjax.io.released import read_released
from mhjax.models.model_config import ATTENTION_WIDTH, ModelConfig
from mhjax.models.probe import model_sizes

DEFAULTS = {"horizon": 100, "max_steps": 100, "include_sink": True, "chain": "reference"}
_CHAINS = ("reference", "normalized")


def one_line(text: str) -> str:
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
def layer_metrics(
    attn,
    beta,
    horizon: int = 100,
    max_steps: int = 100,
    include_sink: bool = True,
    chain: str = "reference",
    block: int = 8,
):
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


def learned_head_weights(params, heads: int) -> np.ndarray:
    """(L, H) learned head weights of every layer from ``block_l/attn/out/kernel``."""
    L = model_sizes(params)["num_layers"]
    kernels = jnp.stack([jnp.asarray(params[f"block_{l}"]["attn"]["out"]["kernel"]) for l in range(L)])
    return np.asarray(dag.head_weights("learned", heads, out_kernel=kernels))


def random_tokens(num: int, length: int, vocab_size: int, seed: int = 0) -> np.ndarray:
    """(num, length) int32 uniform random tokens from ``PRNGKey(seed)``."""
    _check_count_and_seed(num, seed)
    return np.asarray(seqdata.random_sequences(jax.random.PRNGKey(int(seed)), int(num), length, vocab_size))


def _check_count_and_seed(num, seed) -> None:
    if isinstance(num, bool) or not isinstance(num, (int, np.integer)) or num <= 0:
        raise ConfigError(f"--num-sequences: must be a positive integer, got {num!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ConfigError(f"--seed: must be a non-negative integer, got {seed!r}")


def load_sequences(path, max_len: int, vocab_size: int) -> np.ndarray:
    """Read ``--sequences FILE.npy``: an integer array (N, T), 2 <= T <= max_len, tokens in [0, vocab)."""
    path = str(path)
    if not os.path.isfile(path):
        raise ConfigError(f"--sequences: no such file: {path}")
    try:
        arr = np.load(path, allow_pickle=False)
    except Exception as exc:  # not an .npy, pickled object array, truncated ...
        raise ConfigError(
            f"--sequences: {path} is not a readable .npy array ({type(exc).__name__}: {one_line(exc)[:200]})"
        ) from None
    if not isinstance(arr, np.ndarray):
        raise ConfigError(f"--sequences: {path} must hold a single array (an .npy file), not an archive")
    if arr.ndim != 2 or arr.shape[0] < 1:
        raise ConfigError(f"--sequences: expected an (N, T) array with N >= 1, got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.integer) and not np.issubdtype(arr.dtype, np.bool_)):
        raise ConfigError(f"--sequences: expected an integer dtype, got {arr.dtype}")
    if not 2 <= arr.shape[1] <= max_len:
        raise ConfigError(
            f"--sequences: sequence length T={arr.shape[1]} must be in [2, {max_len}] (the model's max_len)"
        )
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= vocab_size:
        raise ConfigError(f"--sequences: tokens must be in [0, {vocab_size - 1}], found values in [{lo}, {hi}]")
    return arr.astype(np.int32)


def check_task(task) -> Task:
    """The registered task named ``task`` (ConfigError naming --task and the registered ones), or
    ``task`` itself when it is a Task (with its parameters bound)."""
    return task if isinstance(task, Task) else get_task(task, "--task")


def task_batch(task, tokens) -> Batch:
    """Given (N, T) tokens -> a Batch with the task's targets(tokens) and its weights (every
    position weighted where the task gives none)."""
    t = check_task(task)
    if isinstance(tokens, Batch):
        return Batch(*(np.asarray(a) for a in tokens))
    if t.targets is None:
        raise ConfigError(
            f"--sequences: task {t.name!r} defines no targets(tokens); analyse it on sequences from its sampler "
            "(leave out --sequences)"
        )
    tokens = np.asarray(tokens)
    targets, weights = t.targets_and_weights(tokens)  # weights: the task's, else every position
    return Batch(tokens, np.asarray(targets), np.asarray(weights, np.float32))


def check_conventions(horizon, max_steps, include_sink, chain) -> dict:
    for name, value in (("--horizon", horizon), ("--max-steps", max_steps)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise ConfigError(f"{name}: must be a positive integer, got {value!r}")
    if chain not in _CHAINS:
        raise ConfigError(f"--chain: must be one of {', '.join(_CHAINS)}; got {chain!r}")
    return {
        "head_weights": "learned",
        "horizon": int(horizon),
        "max_steps": int(max_steps),
        "include_sink": bool(include_sink),
        "chain": chain,
        "fidelity_unit": "percent",
        "std": "population (ddof=0) over sequences",
        "layers_numbered_from": 0,
    }


def analyze_params(
    params,
    heads: int,
    task: str,
    tokens,
    sizes: dict | None = None,
    *,
    options: AnalysisOptions | None = None,
    weights=None,
    **fields,
) -> MemberAnalysis:
    """Accuracy and per-layer DAG metrics of one H-head Transformer.

    Args:
      params: Flax param tree of :class:`mhjax.models.transformer.Transformer`.
      heads: H (the plain H-head model is run).
      task: a registered task's name (mhjax.data.tasks).
      tokens: (N, T) int sequences (targets from the task's ``targets(tokens)``), or a
        :class:`mhjax.data.tasks.Batch` of tokens, targets and weights (its sampler's).
      sizes: model sizes; read off ``params`` when None (:func:`model_sizes`).
      options: an :class:`AnalysisOptions`; keyword ``fields`` replace some of its fields.
      batch_size: sequences per forward/metrics call (bounds memory).
      keep_attention: also return ``attention`` (L, H, T, T) and ``combined``
        (L, T, T) numpy arrays of sequence 0 (for heatmaps) and ``rollout_sink_row`` (L, T),
        the rollout's sink row through each layer, mean over sequences (not JSON-serialisable).
      ablate: also run every head removed / kept alone (:mod:`mhjax.analysis.ablation`).
      weights: (N, T) position weights of ``loss`` and ``accuracy`` (None: the task's; every
        position for tokens given to a task with ``targets(tokens)``).

    Returns a JSON-ready dict: ``loss`` and ``accuracy`` (cross-entropy and token accuracy,
    weighted over positions), ``accuracy_excluding_first`` (weighted positions 1..T-1),
    ``rollout_min`` and ``rollout_min_mean_heads`` (:mod:`mhjax.analysis.rollout`), ``layers``
    (one dict per layer with ``layer``, ``mixing_time_mean/std``, ``fidelity_pct_mean/std``,
    ``best_single_fidelity_pct_mean/std``, ``combined_beats_best_share``, ``head_weights``,
    ``rollout_min``, ``rollout_min_mean_heads``, ``rollout_fidelity_spearman`` and, with
    ``ablate``, ``ablation`` and ``accuracy_synergy``), and the conventions used.
    """
    task = check_task(task)
    o = dataclasses.replace(options or AnalysisOptions(), **fields)  # an unknown field: TypeError
    conventions = check_conventions(o.horizon, o.max_steps, o.include_sink, o.chain)
    sizes = dict(sizes or model_sizes(params))
    attention = sizes.get(ATTENTION_WIDTH) or sizes["width"]  # heads x head size
    if isinstance(heads, bool) or not isinstance(heads, (int, np.integer)) or heads < 1 or attention % heads:
        raise ConfigError(f"--heads: must be a positive divisor of the attention width {attention}, got {heads!r}")
    heads = int(heads)
    tokens, targets, task_weights = task_batch(task, tokens)
    weights = task_weights if weights is None else np.asarray(weights)
    if tokens.ndim != 2 or not 2 <= tokens.shape[1] <= sizes["max_len"]:
        raise ConfigError(
            f"--sequences: expected (N, T) tokens with 2 <= T <= {sizes['max_len']}, got shape {tokens.shape}"
        )
    tokens = tokens.astype(np.int32)
    weights = weights.astype(np.float64)  # 0/1 sums are exact: uniform weights give today's plain means
    N, T = tokens.shape
    forward = ablation.scored_forward_fn(ModelConfig.from_sizes(sizes), heads)
    params = jax.tree_util.tree_map(jnp.asarray, params)
    beta = jnp.asarray(learned_head_weights(params, heads))  # (L, H)

    bs = max(1, min(int(o.batch_size), N))
    correct = np.zeros((N, T), bool)
    full_totals = np.zeros(2)  # the full model's weighted (loss sum, correct sum), for the ablation
    parts: dict[str, list] = {}
    example = None
    for start in range(0, N, bs):
        rows = slice(start, start + bs)
        n = tokens[rows].shape[0]
        # pad the tail so every call has one shape (one compile); padded rows weigh nothing
        chunk, chunk_targets = (np.concatenate([a[rows], np.repeat(a[:1], bs - n, axis=0)]) for a in (tokens, targets))
        chunk_weights = np.concatenate([weights[rows], np.zeros((bs - n, T))]).astype(np.float32)
        preds, attn, totals = forward(params, chunk, chunk_targets.astype(np.int32), chunk_weights)
        full_totals += np.asarray(jax.device_get(totals), np.float64)
        correct[start : start + n] = np.asarray(preds)[:n] == targets[start : start + n]
        if o.keep_attention and example is None:
            example = np.asarray(attn[:, 0])
        m = jax.device_get(
            layer_metrics(
                attn,
                beta,
                horizon=o.horizon,
                max_steps=o.max_steps,
                include_sink=o.include_sink,
                chain=o.chain,
                block=o.block,
            )
        )
        m.update(
            {f"rollout_{k}": v for k, v in jax.device_get(rollout.sink_rollout(attn, beta, o.include_sink)).items()}
        )
        for k, v in m.items():
            parts.setdefault(k, []).append(np.asarray(v)[:, :n])
    per = {k: np.concatenate(v, axis=1) for k, v in parts.items()}  # (L, N)
    full, ablated = ablation.head_ablation(
        params, heads, tokens, targets, sizes, weights, bs, o.ablate, np.asarray(beta), full_totals=full_totals
    )
    rolled, rolled_layers = rollout.rollout_summary(
        {"min": per["rollout_min"], "min_mean_heads": per["rollout_min_mean_heads"]}, per["fidelity"]
    )
    beta_np = np.asarray(beta)
    layers: list[LayerAnalysis] = []
    for l in range(sizes["num_layers"]):
        mix, fid, best = (
            per["mixing_time"][l].astype(np.float64),
            100.0 * per["fidelity"][l].astype(np.float64),
            100.0 * per["best_single"][l].astype(np.float64),
        )
        layers.append(
            {
                "layer": l,
                "mixing_time_mean": float(mix.mean()),
                "mixing_time_std": float(mix.std()),
                "fidelity_pct_mean": float(fid.mean()),
                "fidelity_pct_std": float(fid.std()),
                "best_single_fidelity_pct_mean": float(best.mean()),
                "best_single_fidelity_pct_std": float(best.std()),
                "combined_beats_best_share": float(per["beats"][l].mean()),
                "head_weights": [float(b) for b in beta_np[l]],
                **rolled_layers[l],
                **(ablated[l] if ablated else {}),
            }
        )
    result: MemberAnalysis = {
        "heads": heads,
        "task": task.name,
        "num_sequences": int(N),
        "seq_len": int(T),
        **full,
        "accuracy_excluding_first": float((correct * weights)[:, 1:].sum() / max(weights[:, 1:].sum(), 1e-300)),
        **rolled,
        "conventions": conventions,
        "model": sizes,
        "layers": layers,
    }
    if o.keep_attention:
        result["attention"] = example  # (L, H, T, T)
        result["combined"] = np.einsum("lh,lhij->lij", beta_np, example)
        result["rollout_sink_row"] = per["rollout_sink_row"].mean(axis=1)
    return result


def tokens_for(sequences, num_sequences, seed, max_len, vocab_size) -> tuple[np.ndarray, dict]:
    if sequences is not None:
        if isinstance(sequences, (str, os.PathLike)):
            tokens = load_sequences(sequences, max_len, vocab_size)
            return tokens, {"sequences": str(sequences)}
        tokens = np.asarray(sequences)
        if tokens.ndim != 2 or not np.issubdtype(tokens.dtype, np.integer) or tokens.size == 0:
            raise ConfigError(
                f"--sequences: expected a non-empty (N, T) integer array, got shape {tokens.shape} dtype {tokens.dtype}"
            )
        if not 2 <= tokens.shape[1] <= max_len or tokens.min() < 0 or tokens.max() >= vocab_size:
            raise ConfigError(f"--sequences: need 2 <= T <= {max_len} and tokens in [0, {vocab_size - 1}]")
        return tokens.astype(np.int32), {"sequences": "array"}
    return random_tokens(num_sequences, max_len, vocab_size, seed), {"sequences": "random", "seed": int(seed)}


def task_sequences(task, sequences, num_sequences, seed, max_len, vocab_size) -> tuple[Batch, dict]:
    """The evaluation Batch of ``task``: the given ``sequences`` with the task's targets, or
    ``num_sequences`` drawn by its sampler from PRNGKey(seed) (for copy, cycle and zero the
    same tokens as :func:`random_tokens`)."""
    if sequences is not None:
        tokens, source = tokens_for(sequences, num_sequences, seed, max_len, vocab_size)
        return task_batch(task, tokens), source
    t = check_task(task)
    _check_count_and_seed(num_sequences, seed)
    batch = t.draw_eval(jax.random.PRNGKey(int(seed)), int(num_sequences), max_len, vocab_size)
    return Batch(*(np.asarray(a) for a in batch)), {"sequences": "random", "seed": int(seed)}


def analyze_checkpoint(
    path, heads: int, task: str, sequences=None, num_sequences: int = 50, seed: int = 0, **kwargs
) -> dict:
    """Analyse one released ``{H}_heads_{task}.pt`` file (read by the restricted unpickler).

    ``sequences``: None (``num_sequences`` random sequences of the model's
    max_len from ``seed``), a path to an ``.npy`` (N, T) int array, or an array.
    Extra keyword arguments go to :func:`analyze_params`.
    """
    check_task(task)
    params, sizes = read_released(path, heads)
    batch, source = task_sequences(task, sequences, num_sequences, seed, sizes["max_len"], sizes["vocab_size"])
    result = analyze_params(params, int(heads), task, batch, sizes, **kwargs)
    result = {"source": {"torch_checkpoint": os.path.abspath(str(path)), **source}, **result}
    return result
