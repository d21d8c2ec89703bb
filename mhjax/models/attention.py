"""Causal multi-head self-attention whose head count can be a traced value.

Two ways to run H heads at width D:
- static heads: ``num_heads = H`` and ``heads=None``; standard H-head attention.
- fine heads (the ``fused`` strategy): ``num_heads = F`` fine heads (F a multiple of every
  member's H) and ``heads = H`` (a traced int). Fine scores q_f . k_f are summed
  over the F/H fine heads of each coarse head, scaled by 1/sqrt(D/H) and soft-maxed;
  each fine head then reads its own values with its coarse head's attention. This
  equals plain H-head attention exactly (tested), so members with different head
  counts share one compiled program.
- a member layout (the ``one_program`` strategy): fine heads as above for a member on its
  own, but when the model is vmapped over a program's members, ``layout`` = ((members,
  heads), ...) along the member axis and a custom_vmap rule runs each group's attention
  core at its own STATIC head count: a 1-head member pays for one (B, T, T) map, not F,
  while everything else in the model stays one vmapped copy (layout_attention).

Three implementations of the same function (``implementation`` and the Pallas kernel's
``interpret``, from config.attention through attention_choice.resolve_attention; tested equal,
values and gradients):
- "cpu_kernel", a fused C++ kernel (cpu_attention.py): each (row, head) is done in L1 with
  no T x T tensor stored, and the head count is a runtime argument, so a member on fine
  heads costs what one at its static head count does;
- "pallas", a fused Pallas kernel for GPUs (pallas_attention.py, interpreted on a CPU), at
  static head counts only: plain heads and each group of a layout; a traced head count
  (fused) keeps the JAX fine-head path;
- "pallas_tpu", a fused Pallas kernel for TPUs (pallas_tpu_attention.py, Mosaic; TPU
  interpret mode on a CPU), at static head counts only as "pallas", dropout included;
- "jax", plain JAX einsums that write the (B, F, T, T) maps.

Dropout on the attention probabilities is drawn per COARSE head c from seeds
``bits(fold_in(key, c))`` with a counter-based hash of (batch row, query, key), the same
in every implementation and independent of how finely a program splits heads.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap

from mhjax.models import member_layout
from mhjax.models.attention_choice import KERNELS, core_for
from mhjax.models.dropout_hash import NO_DROPOUT, dropout_threshold, hash_keep
from mhjax.models.precision import compute_dtype, to_dtype, to_float32

Layout = tuple[tuple[int, int], ...]  # (members, heads) per group, in member-axis order


def torch_uniform(fan_in: int):
    """U(-1/sqrt(fan_in), 1/sqrt(fan_in)): the reference framework's Linear default."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, -bound, bound)

    return init


def dense(features: int, fan_in: int, name: str, dtype=None) -> nn.Dense:
    """``dtype``: the matmul's (models/precision.compute_dtype; None: its inputs')."""
    init = torch_uniform(fan_in)
    return nn.Dense(features, dtype=dtype, kernel_init=init, bias_init=init, name=name)


class DenseParams(nn.Module):
    """The parameters of ``dense(features, fan_in)`` (same names, shapes and init), unapplied,
    so several projections of one input can run as one matmul."""

    features: int
    fan_in: int

    @nn.compact
    def __call__(self):
        init = torch_uniform(self.fan_in)
        return self.param("kernel", init, (self.fan_in, self.features)), self.param("bias", init, (self.features,))


def head_groups(heads, num_fine: int):
    """Coarse-head index of each fine head, (F,) int32, for a (traced) head count."""
    group_size = num_fine // heads
    return jnp.arange(num_fine) // group_size


def dropout_keep(seed, batch: int, length: int, threshold: int):
    """(B, T, T) bool keep mask of one coarse head from its seed; the same hash as the C++
    kernel: mix(seed, b * T + i, j)."""
    return hash_keep(seed, (batch, length, length), threshold)


class HashDropout(nn.Module):
    """Inverted dropout with the counter-based hash above (a few integer ops per element,
    where jax.random.bernoulli's threefry costs about 40), seeded from the 'dropout' rng."""

    rate: float

    @nn.compact
    def __call__(self, x, deterministic: bool = True, key=None):
        """``key``: the dropout key, where the caller derived it (transformer.py's scanned layers)."""
        seed, threshold, inv_keep = self.seed(deterministic, key)
        if threshold >= NO_DROPOUT:
            return x
        return jnp.where(hash_keep(seed, x.shape, threshold), x * inv_keep, 0.0).astype(x.dtype)

    def seed(self, deterministic: bool = True, key=None):
        """(seed (2,) uint32, threshold, 1 / keep) of the dropout this module applies, for a
        kernel that applies it itself (the same draw at the same module path; threshold 2^24:
        none)."""
        if deterministic or self.rate == 0.0:
            return jnp.zeros((2,), jnp.uint32), NO_DROPOUT, 1.0
        key = self.make_rng("dropout") if key is None else key
        return (jax.random.bits(key, (2,), jnp.uint32), *dropout_threshold(self.rate))


def coarse_seeds(key, count: int):
    """(count, 2) uint32: the dropout seeds of coarse heads 0..count-1, from fold_in(key, c)."""
    return jnp.stack([jax.random.bits(jax.random.fold_in(key, c), (2,), jnp.uint32) for c in range(count)])


class CausalSelfAttention(nn.Module):
    width: int
    num_heads: int  # fine heads F in this program (static)
    dropout_rate: float = 0.0
    layout: Layout | None = None  # the program's member groups (the one_program strategy)
    implementation: str = "jax"  # "jax", "cpu_kernel", "pallas" or "pallas_tpu" (attention_choice.resolve_attention)
    interpret: bool = False  # a Pallas kernel in interpret mode (a CPU; resolve_attention decides)
    # The attention width A = heads x head size of q, k, v (and the output projection's input);
    # None: the input's width D (parameter matching: head size D / H). The output projection maps
    # A back to D, so the residual stream keeps its width whatever the head size.
    features: int | None = None
    dtype: str = "float32"  # the activations' (models/precision.py)

    @nn.compact
    def __call__(self, x, heads=None, deterministic: bool = True, head_mask=None, dropout_key=None, norm=None):
        """x: (B, T, D) -> (out (B, T, D), probs (B, F, T, T)); heads of size A / F (A =
        ``features``, default D); probs[b, f, i, j] is query i
        (receiver) attending to key j (sender); on fine heads, the fine heads of one coarse head
        carry identical rows. probs always come from the JAX path and are computed only if used
        (dead code otherwise).

        ``head_mask`` (F,) scales each head's output at the input of the output projection (0
        removes a head, leaving the others untouched: head ablation); None (the default) adds
        nothing to the program. ``dropout_key``: the key make_rng("dropout") would give here,
        derived by the caller (transformer.py's scanned layers). ``norm``: the pre-norm's scale
        (D,) when x is the block's input, not yet normalised: the Pallas path's projection kernel
        normalises it on chip (pallas_block.norm_dense)."""
        width = x.shape[-1]
        features = self.features or width
        fine = self.num_heads
        # One (D, 3A) matmul for the three projections (parameters stay query/key/value).
        w, b = zip(*(DenseParams(features, width, name=name)() for name in ("query", "key", "value")))
        compute = compute_dtype(self.dtype)
        w, b = to_dtype(jnp.concatenate(w, axis=1), compute), to_dtype(jnp.concatenate(b), compute)
        if norm is None:
            qkv = x @ w + b
        else:
            from mhjax.models import pallas_block

            qkv = pallas_block.norm_dense(x, norm, w, b, self.interpret)
        q, k, v = jnp.split(qkv, 3, axis=-1)  # the Pallas kernel reads qkv itself (unused there: dead code)
        dropout = not deterministic and self.dropout_rate > 0.0
        if dropout:
            seeds = coarse_seeds(self.make_rng("dropout") if dropout_key is None else dropout_key, fine)
            threshold, inv_keep = dropout_threshold(self.dropout_rate)
        else:
            seeds, threshold, inv_keep = jnp.zeros((fine, 2), jnp.uint32), 1 << 24, 1.0
        probs = attention_probs(q, k, fine, heads)
        # a layout runs each group at its static head count: only a plain traced count is traced
        implementation = core_for(self.implementation, traced_heads=heads is not None and self.layout is None)
        if implementation == "cpu_kernel":  # head counts may be traced: the kernel takes them at run time
            from mhjax.models import cpu_attention

            q, k, v = (to_float32(a) for a in (q, k, v))  # float32 only: cast at its boundary (precision.py)
            count = jnp.full((1,), fine if heads is None else heads, jnp.int32)
            out = cpu_attention.attention(q, k, v, count, seeds, threshold, inv_keep)
        elif self.layout is not None:
            kernel = (implementation, self.interpret) if implementation in KERNELS else None
            arrays = (q, k, v) if kernel is None else (qkv,)
            out = layout_attention(self.layout, arrays, fine, heads, seeds, threshold, inv_keep, kernel)
        elif implementation in KERNELS:
            out = kernel_module(implementation).attention(qkv, seeds, fine, threshold, inv_keep, self.interpret)
        else:
            out, probs = jax_attention(q, k, v, fine, heads, seeds, threshold, inv_keep)
        out = to_dtype(out, compute)
        if head_mask is not None:
            out = out * jnp.repeat(jnp.asarray(head_mask, out.dtype), features // fine)
        return dense(width, features, "out", compute)(out), probs


def kernel_module(implementation: str):
    """The Pallas kernel of ``implementation`` ("pallas": the GPU's, pallas_attention.py;
    "pallas_tpu": the TPU's, pallas_tpu_attention.py): the same attention and members_attention."""
    if implementation == "pallas_tpu":
        from mhjax.models import pallas_tpu_attention

        return pallas_tpu_attention
    from mhjax.models import pallas_attention

    return pallas_attention


def layout_attention(
    layout: Layout,
    arrays,
    fine: int,
    heads,
    seeds,
    threshold: int,
    inv_keep: float,
    kernel: tuple[str, bool] | None = None,
):
    """jax_attention's output for one member, which under vmap over a program's members runs
    group by group at static head counts: group g's members (consecutive on the member axis)
    at ``layout[g][1]`` heads with the dropout seeds of those coarse heads, so every member
    computes what plain attention at its own head count does (tested). ``arrays``: (q, k, v);
    with ``kernel`` = (implementation, interpret) not None, (qkv,) the fused (B, T, 3D)
    projection, which that Pallas kernel's members_attention (kernel_module; in interpret mode
    if ``interpret``) reads for every group at its head count on the member axis itself: no
    per-group slice, concatenation or padded gradient, no q/k/v split. Reverse mode differentiates a
    custom_vmap function only from outside the vmap (neither inside it nor unbatched): such a
    model's gradient is taken of the summed member losses
    (engine.members_step); for one member alone, use the plain model at its head count."""

    def split(arrays):
        return arrays if len(arrays) == 3 else jnp.split(arrays[0], 3, axis=-1)

    @custom_vmap
    def core(heads, seeds, *arrays):
        return jax_attention(*split(arrays), fine, heads, seeds, threshold, inv_keep)[0]

    def static(q, k, v, seeds, h):
        return jax_attention(q, k, v, h, None, seeds[:h], threshold, inv_keep)[0]

    @core.def_vmap
    def by_group(axis_size, in_batched, *args):
        _, seeds, *arrays = (x if b else jnp.broadcast_to(x, (axis_size, *x.shape)) for x, b in zip(args, in_batched))

        def groups(local: Layout):  # the groups of the members here (all, or this device's shard)
            if kernel is not None:  # one kernel call per group, reading and writing its members in place
                implementation, interpret = kernel
                module = kernel_module(implementation)
                return module.members_attention(arrays[0], seeds, local, threshold, inv_keep, interpret)
            q, k, v = split(arrays)
            outs, start = [], 0
            for n, h in local:
                group = slice(start, start + n)
                run = lambda q, k, v, s, h=h: static(q, k, v, s, h)
                outs.append(jax.vmap(run)(q[group], k[group], v[group], seeds[group]))
                start += n
            return jnp.concatenate(outs)

        # Under train/engine.py's shard_map a device sees its shard of the member axis only
        return member_layout.on_shard(layout, axis_size, groups), True

    return core(jnp.asarray(fine if heads is None else heads, jnp.int32), seeds, *arrays)


def jax_attention(q, k, v, fine: int, heads, seeds, threshold: int, inv_keep: float):
    """The plain-JAX path: (out (B, T, D) before the output projection, probs (B, F, T, T)).
    The same function as cpu_attention.attention (tested); threshold >= 2^24: no dropout.
    bfloat16 q/k/v: probs in float32 (attention_probs), read with v in bfloat16."""
    batch, length, width = q.shape
    probs = attention_probs(q, k, fine, heads)
    attended = probs
    if threshold < (1 << 24):
        group = jnp.arange(fine) if heads is None else head_groups(heads, fine)
        keep = jax.vmap(lambda s: dropout_keep(s, batch, length, threshold))(seeds)[group]
        attended = probs * jnp.moveaxis(keep, 0, 1).astype(probs.dtype) * inv_keep
    attended = to_dtype(attended, v.dtype)
    out = jnp.einsum("bfts,bsfd->btfd", attended, _split(v, fine)).reshape(batch, length, width)
    return out, probs


def _split(x, fine: int):
    batch, length, width = x.shape
    return x.reshape(batch, length, fine, width // fine)


def attention_probs(q, k, fine: int, heads=None):
    """(B, F, T, T) causal attention probabilities of the fine heads (with ``heads``: summed
    scores over each coarse head's fine heads, scaled by 1/sqrt(D/H)); float32 whatever q's dtype
    (a bfloat16 matmul with float32 results, the softmax in float32)."""
    width, length = q.shape[-1], q.shape[-2]
    wide = {} if q.dtype == jnp.float32 else {"preferred_element_type": jnp.float32}
    scores = jnp.einsum("btfd,bsfd->bfts", _split(q, fine), _split(k, fine), **wide)
    if heads is None:
        scale = 1.0 / math.sqrt(width // fine)
    else:
        group = head_groups(heads, fine)
        same_group = (group[:, None] == group[None, :]).astype(scores.dtype)
        scores = jnp.einsum("fg,bgts->bfts", same_group, scores)
        scale = jax.lax.rsqrt(width / jnp.asarray(heads, scores.dtype))
    causal = jnp.tril(jnp.ones((length, length), dtype=bool))
    scores = jnp.where(causal, scores * scale, jnp.finfo(scores.dtype).min)
    return jax.nn.softmax(scores, axis=-1)
