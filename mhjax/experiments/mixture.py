"""Single-layer multi-head attention on the tokenized mixture under plain GD (spec §1-§5).

One compiled program holds every member: parameters are padded to the sweep's largest head
count H_max and a member's own H enters only through its head mask and the 1/sqrt(H) output
scale (``mhjax.models.classifier``), and every training set is padded to the largest n with
a per-example weight (1 on the member's own n examples, 0 on the padding), so the loss is
the mean over the member's own examples. Masked heads and padded examples contribute exactly
nothing, so a member computes the same numbers in any sweep (up to float summation order).

Data. Example i of a seed's training set is drawn from ``fold_in(data key, i)`` with the
data key a function of (config.seed, member seed) only: every head count and step size of a
seed trains on the same examples, and a smaller n is a prefix of a larger one (n=32 = the
first 32 examples of n=128). Test data (``data.num_test`` examples) come the same way from a
separate key of the seed: fresh draws from the same distribution, the same for every member
of a seed. Both are sampled once on the host and carried in the member constants.

theta_0. ``init.scheme``:
  * "zero_plus_step" (default, the spec's theta_0): zero parameters followed by ONE full-batch
    GD step of size ``init.first_step`` (None = the member's own step size) on the member's
    training set. From zero the gradient in W vanishes (U = 0), so theta_0 has W = 0 and
    U_h = -first_step * dL/dU_h, the same for every active head.
  * "random" (variant): every entry of W and U i.i.d. N(0, init.scale^2); head h's values
    come from fold_in(member key, h), so they do not depend on H_max.
Training is plain full-batch GD (optax.sgd, constant step = the member's ``step_size``) on
the logistic loss softplus(-y Phi), K = ``train.steps`` steps.

Per-member outputs (results.json), besides the core fields:
  * from ``evaluate`` (also logged as eval/<name> every ``train.eval_every`` steps, which is
    the cadence of the training-path quantities): test_loss, test_accuracy, train_accuracy,
    train_loss_eval (L(theta) at the evaluated step; the core train_loss is the loss of the
    last step's input, L(theta_{K-1})), grad_norm_over_loss = ||grad L|| / L,
    hessian_min / hessian_max (Lanczos, ``analysis.lanczos_iters`` iterations, on Hessian-
    vector products of the padded parameters: masked heads add exact zero eigenvalues, so
    hessian_min is min(lambda_min of the member, 0)) and
    min_hessian_eig_over_loss_sqrtH = sqrt(H) * hessian_min / L;
  * from ``extra_results``: ntk_margin, ntk_margin_gap (the margin is a certified lower
    bound, the true margin lies in [margin, margin + gap]; <= 0 means not certified separable
    and its size is then meaningless), ntk_radius (max_i ||grad Phi(X_i)||) and
    ntk_margin_normalized = margin / radius, of the empirical NTK at theta_0 of the member's
    own H on its own n training examples; linear_margin (flattened tokens) and
    linear_margin_mean (mean token) with their normalized versions; param_distance =
    ||theta_K - theta_0||.
``finalize`` writes loss_vs_K.png, test_loss_vs_n.png, ntk_margin_vs_H.png and
mixture_summary.md into the workdir.
"""
from __future__ import annotations

import functools
import math
import os
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from mhjax import config as cfg
from mhjax.analysis import ntk
from mhjax.io.curves import read_curves
from mhjax.data.mixture import num_relevant_tokens, sample_mixture
from mhjax.models.classifier import QUERIES, classifier_apply
from mhjax.experiments.base import Experiment
from mhjax.train.engine import Program
from mhjax.train.sweep import Member, derive_key, expand

STRATEGIES = ("auto", "unrolled", "fused", "grouped", "one_program")  # accepted for the CLI's sake; always one program
INIT_SCHEMES = ("zero_plus_step", "random")
SWEEP_FIELDS = ("heads", "seed", "num_train", "step_size")
MAX_HEADS = 4096


# ---------------------------------------------------------------------- #
# Validation
# ---------------------------------------------------------------------- #
def _require_each(values, field: str, ok, what: str):
    for value in values:
        if not ok(value):
            raise cfg.ConfigError(f"config.{field}: each must be {what}; got {value!r}")


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_number(value) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


# Every field a mixture config may have (a typo in a config file is an error, not ignored).
FIELDS = {
    "experiment": None, "seed": None, "strategy": None, "devices": None, "sweep": None,
    "data": {"dim", "seq_len", "num_relevant_per_label", "num_noise_clusters", "relevant_fraction",
             "signal_norm", "noise_std", "num_test"},
    "model": {"query"},
    "init": {"scheme", "first_step", "scale"},
    "train": {"steps", "chunk_steps", "eval_every", "checkpoint_every"},
    "analysis": {"lanczos_iters", "margin_iters", "margin_tol"},
}


def validate(config) -> None:
    """Raise ConfigError (one line naming ``config.<field>``) on the first bad field."""
    cfg.require_known_fields(config, FIELDS)
    cfg.require_nonneg_int(config, "seed")
    if config.seed >= 2**32:  # PRNGKey keeps only 32 bits: 2**32 would silently equal seed 0
        raise cfg.ConfigError(f"config.seed: must be an integer in [0, 2**32), got {config.seed}")
    cfg.require_choice(config, "strategy", STRATEGIES)
    if "devices" in config:
        cfg.require_device_count(config, "devices")
    # sweep
    if "sweep" not in config:
        raise cfg.ConfigError("config.sweep: missing field")
    for field in config.sweep.keys():
        if field not in SWEEP_FIELDS:
            raise cfg.ConfigError(f"config.sweep.{field}: unknown sweep field (allowed: {', '.join(SWEEP_FIELDS)})")
    heads = cfg.require_nonempty_tuple(config, "sweep.heads")
    _require_each(heads, "sweep.heads", lambda h: _is_int(h) and 1 <= h <= MAX_HEADS, f"an integer in [1, {MAX_HEADS}]")
    seeds = cfg.require_nonempty_tuple(config, "sweep.seed")
    _require_each(seeds, "sweep.seed", lambda s: _is_int(s) and 0 <= s < 2**32, "an integer in [0, 2**32)")
    sizes = cfg.require_nonempty_tuple(config, "sweep.num_train")
    _require_each(sizes, "sweep.num_train", lambda n: _is_int(n) and n >= 1, "an integer >= 1")
    steps = cfg.require_nonempty_tuple(config, "sweep.step_size")
    _require_each(steps, "sweep.step_size", lambda e: _is_number(e) and e > 0 and math.isfinite(e), "a positive finite number")
    # data
    for field in ("data.dim", "data.seq_len", "data.num_relevant_per_label", "data.num_test"):
        cfg.require_positive(config, field, int)
    cfg.require_nonneg_int(config, "data.num_noise_clusters")
    cfg.require_range(config, "data.relevant_fraction", 0.0, 1.0, inclusive_low=False)
    cfg.require_range(config, "data.signal_norm", 0.0, math.inf)
    cfg.require_range(config, "data.noise_std", 0.0, math.inf)
    d = config.data
    need = 2 * d.num_relevant_per_label + d.num_noise_clusters
    if d.dim < need:
        raise cfg.ConfigError(
            f"config.data.dim: must be >= 2*num_relevant_per_label + num_noise_clusters = {need} (orthogonal cluster means); got {d.dim}"
        )
    k = num_relevant_tokens(d)
    if k < 1:
        raise cfg.ConfigError(
            f"config.data.relevant_fraction: relevant_fraction * seq_len must round to >= 1 relevant token; got {d.relevant_fraction} * {d.seq_len}"
        )
    if k < d.seq_len and d.num_noise_clusters < 1:
        raise cfg.ConfigError("config.data.num_noise_clusters: must be >= 1 when some tokens are irrelevant (relevant_fraction * seq_len < seq_len); got 0")
    # model, init
    cfg.require_choice(config, "model.query", QUERIES)
    cfg.require_choice(config, "init.scheme", INIT_SCHEMES)
    first = cfg._get(config, "init.first_step")
    if first is not None and not (_is_number(first) and first > 0 and math.isfinite(first)):
        raise cfg.ConfigError(f"config.init.first_step: must be None (= the member's step_size) or a positive number; got {first!r}")
    cfg.require_range(config, "init.scale", 0.0, math.inf, inclusive_low=False)
    # train, analysis
    for field in ("train.steps", "train.chunk_steps"):
        cfg.require_positive(config, field, int)
    if config.train.steps > 2**31 - 1:  # the per-member step counter is int32
        raise cfg.ConfigError(f"config.train.steps: must be at most {2**31 - 1}, got {config.train.steps}")
    for field in ("train.eval_every", "train.checkpoint_every"):
        cfg.require_nonneg_int(config, field)
    for field in ("analysis.lanczos_iters", "analysis.margin_iters"):
        cfg.require_positive(config, field, int)
    cfg.require_range(config, "analysis.margin_tol", 0.0, 1.0, inclusive_low=False, inclusive_high=False)


# ---------------------------------------------------------------------- #
# Recipe: one member, traced
# ---------------------------------------------------------------------- #
SAMPLE_BLOCK = 64  # examples per call of the host sampler (one compiled program for any count)


def sample_examples(key, data_config, count: int, start=0):
    """Examples start..start+count-1 of the stream of ``key``: example i is drawn from
    fold_in(key, i), so it does not depend on ``count`` (a smaller set is a prefix of a larger
    one). Returns (X (count, T, d), y (count,))."""
    keys = jax.vmap(lambda i: jax.random.fold_in(key, i))(start + jnp.arange(count, dtype=jnp.uint32))
    X, y = jax.vmap(lambda k: sample_mixture(k, data_config, 1))(keys)
    return X[:, 0], y[:, 0]


DATA_FIELDS = ("dim", "seq_len", "num_relevant_per_label", "num_noise_clusters", "relevant_fraction", "signal_norm", "noise_std")


@functools.partial(jax.jit, static_argnames="data")
def _sample_block(key, start, data):
    return sample_examples(key, types.SimpleNamespace(**dict(data)), SAMPLE_BLOCK, start)


class HostSampler:
    """``sample_examples`` on the host, compiled once per data config and process for a block of
    SAMPLE_BLOCK examples and called block after block (the sampler's compile takes seconds on
    CPU, so neither the count nor a new experiment object may trigger another)."""

    def __init__(self, data_config):
        self.data = tuple((field, data_config[field]) for field in DATA_FIELDS)

    def __call__(self, key, count: int):
        blocks = [jax.device_get(_sample_block(jnp.asarray(key), jnp.uint32(b * SAMPLE_BLOCK), self.data))
                  for b in range(-(-count // SAMPLE_BLOCK))]
        X = np.concatenate([b[0] for b in blocks])[:count]
        y = np.concatenate([b[1] for b in blocks])[:count]
        return X, y


class MixtureRecipe:
    """The engine's recipe for every member of a mixture sweep (padded to ``max_heads`` heads
    and ``max_train`` examples)."""

    def __init__(self, config, max_heads: int, max_train: int):
        self.query = config.model.query
        self.scheme = config.init.scheme
        self.scale = float(config.init.scale)
        self.lanczos_iters = int(config.analysis.lanczos_iters)
        self.max_heads, self.max_train = int(max_heads), int(max_train)
        self.dim, self.seq_len = int(config.data.dim), int(config.data.seq_len)

    # -- model pieces ---------------------------------------------------
    def phi(self, params, X, consts):
        return classifier_apply(params, X, consts["head_mask"], consts["heads"], self.query)

    def apply_single(self, consts):
        """(params, x (T, d)) -> scalar Phi of this member (its own head mask and H)."""
        return lambda p, x: classifier_apply(p, x, consts["head_mask"], consts["heads"], self.query)

    def train_loss(self, params, consts):
        """Mean logistic loss over the member's own n examples (padding has weight 0)."""
        margins = consts["y"] * self.phi(params, consts["X"], consts)
        return jnp.sum(consts["weights"] * jax.nn.softplus(-margins)) / consts["num_train"], margins

    def _zeros(self):
        d, t, h = self.dim, self.seq_len, self.max_heads
        u_shape = (h, t, d) if self.query == "full" else (h, d)
        return {"W": jnp.zeros((h, d, d), jnp.float32), "U": jnp.zeros(u_shape, jnp.float32)}

    # -- engine protocol --------------------------------------------------
    def init_params(self, consts):
        if self.scheme == "random":
            d, t = self.dim, self.seq_len
            u_shape = (t, d) if self.query == "full" else (d,)
            key = jax.random.fold_in(consts["key"], 0)

            def head(h):
                k_w, k_u = jax.random.split(jax.random.fold_in(key, h))
                return (self.scale * jax.random.normal(k_w, (d, d), jnp.float32),
                        self.scale * jax.random.normal(k_u, u_shape, jnp.float32))

            W, U = jax.vmap(head)(jnp.arange(self.max_heads))
            mask = consts["head_mask"]
            return {"W": W * mask[:, None, None], "U": U * mask.reshape((-1,) + (1,) * (U.ndim - 1))}
        zeros = self._zeros()
        grads = jax.grad(lambda p: self.train_loss(p, consts)[0])(zeros)
        return jax.tree_util.tree_map(lambda p, g: p - consts["first_step"] * g, zeros, grads)

    def optimizer(self, consts):
        return optax.inject_hyperparams(optax.sgd)(learning_rate=consts["step_size"])

    def loss(self, params, consts, step):
        loss, margins = self.train_loss(params, consts)
        accuracy = jnp.sum(consts["weights"] * (margins > 0)) / consts["num_train"]
        return loss, {"accuracy": accuracy}

    def evaluate(self, params, consts):
        test_margins = consts["y_test"] * self.phi(params, consts["X_test"], consts)
        loss_fn = lambda p: self.train_loss(p, consts)[0]
        (loss, margins), grads = jax.value_and_grad(lambda p: self.train_loss(p, consts), has_aux=True)(params)
        grad_norm = jnp.linalg.norm(ravel_pytree(grads)[0])
        lam_min, lam_max = ntk.hessian_extreme_eigs(loss_fn, params, num_iters=self.lanczos_iters,
                                                    key=jax.random.fold_in(consts["key"], 1))
        heads = jnp.asarray(consts["heads"], jnp.float32)
        return {
            "test_loss": jnp.mean(jax.nn.softplus(-test_margins)),
            "test_accuracy": jnp.mean(test_margins > 0),
            "train_loss_eval": loss,
            "train_accuracy": jnp.sum(consts["weights"] * (margins > 0)) / consts["num_train"],
            "grad_norm_over_loss": grad_norm / loss,
            "hessian_min": lam_min,
            "hessian_max": lam_max,
            "min_hessian_eig_over_loss_sqrtH": jnp.sqrt(heads) * lam_min / loss,
        }

    def ntk_and_distance(self, params_K, consts):
        """(NTK Gram at theta_0 over all max_train examples, ||theta_K - theta_0||) of one member."""
        theta0 = self.init_params(consts)
        gram = ntk.ntk_gram(self.apply_single(consts), theta0, consts["X"], chunk_size=min(64, self.max_train))
        distance = jnp.linalg.norm(ravel_pytree(params_K)[0] - ravel_pytree(theta0)[0])
        return gram, distance


# ---------------------------------------------------------------------- #
# Experiment: members, constants, results, figures
# ---------------------------------------------------------------------- #
class MixtureExperiment(Experiment):
    kind = "mixture"

    def __init__(self, config):
        validate(config)
        self.config = config
        self.members: list[Member] = expand(dict(config.sweep))
        self.max_heads = max(m["heads"] for m in self.members)
        self.max_train = max(m["num_train"] for m in self.members)

    # -- data --------------------------------------------------------------
    def data_key(self, seed: int):
        return derive_key(self.config.seed, seed, "mixture-data")

    def test_key(self, seed: int):
        return derive_key(self.config.seed, seed, "mixture-test")

    @functools.cached_property
    def _sampler(self):
        return HostSampler(self.config.data)

    @functools.lru_cache(maxsize=None)
    def train_data(self, seed: int):
        """The seed's first max_train training examples as numpy (X, y)."""
        return self._sampler(self.data_key(seed), self.max_train)

    @functools.lru_cache(maxsize=None)
    def test_data(self, seed: int):
        """The seed's data.num_test test examples (a separate key: fresh draws) as numpy (X, y)."""
        return self._sampler(self.test_key(seed), int(self.config.data.num_test))

    # -- engine protocol ---------------------------------------------------
    def member_constants(self, member: Member) -> dict:
        X, y = self.train_data(member["seed"])
        X_test, y_test = self.test_data(member["seed"])
        n, eta = member["num_train"], float(member["step_size"])
        first = self.config.init.first_step
        return {
            "key": derive_key(self.config.seed, member["seed"], member.name),
            "X": X,
            "y": y,
            "X_test": X_test,
            "y_test": y_test,
            "weights": (np.arange(self.max_train) < n).astype(np.float32),
            "num_train": np.float32(n),
            "heads": np.int32(member["heads"]),
            "head_mask": (np.arange(self.max_heads) < member["heads"]).astype(np.float32),
            "step_size": np.float32(eta),
            "first_step": np.float32(eta if first is None else first),
        }

    def programs(self, strategy: str, backend: str):
        """One program for every member (head counts padded to H_max, training sets to n_max)."""
        return [Program("all", list(range(len(self.members))), MixtureRecipe(self.config, self.max_heads, self.max_train))]

    def member_info(self, member: Member) -> dict:
        d, t, h = self.config.data.dim, self.config.data.seq_len, member["heads"]
        per_head = d * d + (t * d if self.config.model.query == "full" else d)
        return {"params": h * per_head}

    # -- results ---------------------------------------------------------
    def extra_results(self, sweep, states) -> dict:
        """NTK margin at theta_0, linear margins and ||theta_K - theta_0|| of every member."""
        a = self.config.analysis
        solver = dict(num_iters=int(a.margin_iters), tol=float(a.margin_tol))
        out, linear = {}, {}
        for name, idx, recipe in sweep.programs:
            fn = jax.jit(lambda params, consts, recipe=recipe: jax.lax.map(lambda pc: recipe.ntk_and_distance(*pc), (params, consts)))
            grams, distances = jax.device_get(fn(states[name].params, sweep.consts[name]))
            for j, i in enumerate(idx):
                member = self.members[i]
                n, seed = member["num_train"], member["seed"]
                X, y = self.train_data(seed)
                margin, gap, info = ntk.simplex_margin(grams[j][:n, :n], y[:n], return_info=True, **solver)
                if (seed, n) not in linear:
                    flat = ntk.linear_margin(X[:n], y[:n], "flatten", return_info=True, **solver)
                    mean = ntk.linear_margin(X[:n], y[:n], "mean", return_info=True, **solver)
                    linear[(seed, n)] = (flat, mean)
                flat, mean = linear[(seed, n)]
                out[i] = {
                    "ntk_margin": float(margin),
                    "ntk_margin_gap": float(gap),
                    "ntk_radius": float(info["radius"]),
                    "ntk_margin_normalized": _ratio(margin, info["radius"]),
                    "linear_margin": float(flat[0]),
                    "linear_margin_normalized": _ratio(flat[0], flat[2]["radius"]),
                    "linear_margin_mean": float(mean[0]),
                    "linear_margin_mean_normalized": _ratio(mean[0], mean[2]["radius"]),
                    "param_distance": float(distances[j]),
                }
        return out

    def metric_tags(self) -> list[str]:
        return [f"eval/{k}" for k in ("test_loss", "test_accuracy", "train_accuracy", "grad_norm_over_loss", "min_hessian_eig_over_loss_sqrtH")]

    def finalize(self, workdir: str, payload: dict) -> None:
        """Figures (PNG) and mixture_summary.md in the workdir."""
        write_figures_and_summary(workdir, payload["members"], chunk_steps=int(self.config.train.chunk_steps))


def _ratio(margin, radius) -> float:
    return float(margin) / float(radius) if radius > 0 else float("nan")


# ---------------------------------------------------------------------- #
# Figures and summary (host side, from results.json records and TensorBoard runs)
# ---------------------------------------------------------------------- #
def read_loss_curve(workdir: str, member: str, tag: str = "train/loss"):
    """(steps, values) of a scalar tag of W/tb/<member>; empty arrays when absent."""
    curve = read_curves(workdir, [member], [tag])[member].get(tag)
    return curve if curve is not None else (np.zeros(0), np.zeros(0))


def _groups(records, keys):
    out = {}
    for r in records:
        out.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    return dict(sorted(out.items(), key=lambda kv: tuple((v is None, v) for v in kv[0])))


def _mean(records, field):
    values = [r.get(field) for r in records]
    values = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return float(np.mean(values)) if values else float("nan")


def _fmt(value) -> str:
    return "-" if value is None or (isinstance(value, float) and not math.isfinite(value)) else f"{value:.4g}"


SUMMARY_COLUMNS = (
    ("ntk_margin", "NTK margin at theta_0"),
    ("ntk_margin_normalized", "NTK margin / radius"),
    ("linear_margin", "linear margin (flat)"),
    ("linear_margin_normalized", "linear margin / radius"),
    ("linear_margin_mean", "linear margin (mean token)"),
    ("train_loss_eval", "train loss"),
    ("train_accuracy", "train acc"),
    ("test_loss", "test loss"),
    ("test_accuracy", "test acc"),
    ("param_distance", "dist(theta_K, theta_0)"),
    ("grad_norm_over_loss", "norm(grad L) / L"),
    ("min_hessian_eig_over_loss_sqrtH", "sqrt(H) lambda_min / L"),
)


def summary_markdown(records: list[dict]) -> str:
    lines = [
        "# Tokenized mixture: one-layer multi-head attention under GD",
        "",
        "Means over seeds. Margins: certified lower bounds (simplex dual); a value <= 0 means the",
        "features were not certified separable and its size is not meaningful. `sep` counts the",
        "seeds whose NTK features at theta_0 are certified separable; radius = the largest feature",
        "norm, so margin / radius compares feature maps of different scales. Losses, accuracies and",
        "the last two columns at the final parameters theta_K.",
        "",
    ]
    header = ["n", "eta", "H", "seeds", "sep"] + [title for _, title in SUMMARY_COLUMNS]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (n, eta, h), group in _groups(records, ("num_train", "step_size", "heads")).items():
        sep = sum(1 for r in group if (r.get("ntk_margin") or 0) > 0)
        row = [str(n), _fmt(eta), str(h), str(len(group)), f"{sep}/{len(group)}"]
        row += [_fmt(_mean(group, field)) for field, _ in SUMMARY_COLUMNS]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def write_figures_and_summary(workdir: str, records: list[dict], chunk_steps: int = 1, log=None) -> list[str]:
    """loss_vs_K.png, test_loss_vs_n.png, ntk_margin_vs_H.png and mixture_summary.md; returns
    the paths written. A figure that fails is skipped with a message (results are already saved)."""
    log = log or (lambda m: print(m, file=sys.stderr))
    written = []
    path = os.path.join(workdir, "mixture_summary.md")
    with open(path, "w") as f:
        f.write(summary_markdown(records))
    written.append(path)
    for filename, draw in (("loss_vs_K.png", lambda fig: _plot_loss_vs_K(fig, workdir, records, chunk_steps)),
                           ("test_loss_vs_n.png", lambda fig: _plot_test_loss_vs_n(fig, records)),
                           ("ntk_margin_vs_H.png", lambda fig: _plot_margin_vs_H(fig, records))):
        try:
            from matplotlib.figure import Figure

            fig = Figure(figsize=(11, 4.2), layout="constrained")
            draw(fig)
            path = os.path.join(workdir, filename)
            fig.savefig(path, dpi=110)
            written.append(path)
        except Exception as exc:  # a figure must never cost a finished run
            log(f"mixture: {filename} skipped ({type(exc).__name__}: {exc})")
    return written


def _colors(heads):
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    heads = sorted(set(heads))
    return {h: cmap(i / max(len(heads) - 1, 1)) for i, h in enumerate(heads)}


def _plot_loss_vs_K(fig, workdir, records, chunk_steps):
    """Train loss (mean over seeds) vs K, log-log, one panel per (n, eta), one line per H, with
    a 1/K reference. TensorBoard's train/loss at step s is the mean of L(theta_k) over the chunk
    k = s-c..s-1, plotted at its centre s - (c+1)/2."""
    panels = _groups(records, ("num_train", "step_size"))
    colors = _colors(r["heads"] for r in records)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    shift = (chunk_steps + 1) / 2
    for ax, ((n, eta), group) in zip(axes, panels.items()):
        anchor = None
        for h, members in _groups(group, ("heads",)).items():
            curves = [read_loss_curve(workdir, r["name"]) for r in members]
            curves = [c for c in curves if c[0].size]
            if not curves:
                continue
            length = min(c[0].size for c in curves)
            steps = curves[0][0][:length] - shift
            values = np.mean([c[1][:length] for c in curves], axis=0)
            keep = (steps > 0) & np.isfinite(values) & (values > 0)
            ax.loglog(steps[keep] + 0.0, values[keep], color=colors[h[0]], label=f"H={h[0]}")
            if keep.any() and anchor is None:
                anchor = (steps[keep][0], values[keep][0], steps[keep][-1])
        if anchor is not None:
            k0, l0, k1 = anchor
            ks = np.geomspace(k0, k1, 20)
            ax.loglog(ks, l0 * k0 / ks, "k--", lw=1, label="1/K")
        ax.set_title(f"n={n}, eta={eta:g}")
        ax.set_xlabel("GD steps K")
        ax.set_ylabel("train loss (mean over seeds)")
        ax.legend(fontsize=7)


def _plot_test_loss_vs_n(fig, records):
    """Final test loss vs n (mean and range over seeds), one line per H; a panel per eta."""
    panels = _groups(records, ("step_size",))
    colors = _colors(r["heads"] for r in records)
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    heads = sorted(colors)
    for ax, ((eta,), group) in zip(axes, panels.items()):
        for (h,), members in _groups(group, ("heads",)).items():
            nudge = 1.0 + 0.015 * (heads.index(h) - (len(heads) - 1) / 2)  # keep error bars apart
            by_n = _groups(members, ("num_train",))
            ns = np.array([k[0] for k in by_n], dtype=float)
            vals = [[r.get("test_loss") for r in v if r.get("test_loss") is not None] for v in by_n.values()]
            mean = np.array([np.mean(v) if v else np.nan for v in vals])
            lo = np.array([np.min(v) if v else np.nan for v in vals])
            hi = np.array([np.max(v) if v else np.nan for v in vals])
            ax.errorbar(ns * nudge, mean, yerr=[mean - lo, hi - mean], color=colors[h], marker="o", capsize=2, label=f"H={h}")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(f"test loss after training, eta={eta:g}")
        ax.set_xlabel("training set size n")
        ax.set_ylabel("test loss (mean, min-max over seeds)")
        ax.legend(fontsize=7)


def _plot_margin_vs_H(fig, records):
    """Left: NTK margin at theta_0 (clipped at 0: <= 0 means not certified separable) vs H.
    Right: margins normalised by the feature radius, NTK vs the linear baselines."""
    left, right = fig.subplots(1, 2)
    groups = _groups(records, ("num_train", "step_size"))
    for (n, eta), group in groups.items():
        by_h = _groups(group, ("heads",))
        hs = np.array([h[0] for h in by_h], dtype=float)
        margin = np.array([max(_mean(v, "ntk_margin"), 0.0) for v in by_h.values()])
        normed = np.array([max(_mean(v, "ntk_margin_normalized"), 0.0) for v in by_h.values()])
        label = f"n={n}, eta={eta:g}"
        (line,) = left.plot(hs, margin, marker="o", label=label)
        right.plot(hs, normed, marker="o", color=line.get_color(), label=f"NTK, {label}")
        lin = max(_mean(group, "linear_margin_normalized"), 0.0)
        right.axhline(lin, ls="--", color=line.get_color(), lw=1, label=f"linear (flat), n={n}")
        lin_mean = max(_mean(group, "linear_margin_mean_normalized"), 0.0)
        right.axhline(lin_mean, ls=":", color=line.get_color(), lw=1, label=f"linear (mean token), n={n}")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("heads H")
        ax.legend(fontsize=7)
    left.set_ylabel("NTK margin at theta_0 (clipped at 0)")
    left.set_title("NTK margin vs H")
    right.set_ylabel("margin / max feature norm (clipped at 0)")
    right.set_title("scale-free margins: NTK vs linear on raw inputs")
