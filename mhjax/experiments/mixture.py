"""Single-layer multi-head attention on the tokenized mixture under plain GD, after
"On the Optimization and Generalization of Multi-head Attention" (Deora, Ghaderi, Taheri,
Thrampoulidis; arXiv 2310.12680).

One compiled program holds every member: parameters are padded to the sweep's largest head
count H_max and a member's own H enters only through its head mask and the 1/sqrt(H) output
scale (``mhjax.models.classifier``), and every training set is padded to the largest n with
a per-example weight (1 on the member's own n examples, 0 on the padding), so the loss is
the mean over the member's own examples. Masked heads and padded examples contribute exactly
nothing, so a member computes the same numbers in any sweep (up to float summation order).

Data. Example i of a seed's training set is drawn from ``fold_in(data key, i)`` with the
data key a function of (config.seed, member seed) only: every head count and step size of a
seed trains on the same examples, and a smaller n is a prefix of a larger one. Test data
(``data.num_test`` examples) come the same way from a separate key of the seed: fresh draws
from the same distribution, the same for every member of a seed.

theta_0. ``init.scheme`` (head h's random values from fold_in(member key, h): independent
of H_max; ``init.tau`` is their standard deviation, or the member's ``sweep.init_tau`` value when
that is swept: tau is a per-member constant of the one program. tau, eta and n stay out of the
key (SHARED_DRAWS), so members differing only in those start from the same random directions,
at their own scale;
tau = 0 makes every draw zero, so all heads start equal and stay equal):
  * "random_decoders" (default): U_h ~ N(0, tau^2), W_h = 0. The heads differ from the start,
    so GD moves them apart and an H-head member is a genuine width-H network; its NTK at
    theta_0 is an average over H random heads, which converges as H grows (arXiv 2310.12680).
  * "antisymmetric": head pairs (U, -U), W = 0, so Phi(theta_0) = 0; for an odd H the last
    active head has no partner and is zero (the member has H-1 live heads at theta_0 and
    still divides by sqrt(H)).
  * "zero_plus_step" (degenerate, kept for comparison): zero parameters then one GD step,
    which gives W = 0 and the SAME U_h for every head; GD keeps the heads identical forever,
    and an H-head member equals a one-head model with step eta on U' = sqrt(H) U and eta/H
    on W: its H axis is a learning-rate axis (tested).
  * "random": every entry of W and U i.i.d. N(0, tau^2).
``init.first_step``: None = no extra step, except for "zero_plus_step" where None means
the member's own step size; a positive number = one full-batch GD step of that size after
the scheme's draw (0 = no step).

Training: full-batch GD (optax.sgd) for K = ``train.steps`` steps with plug-ins chosen by name
(models/mixture_parts.py, data/mixture_data.py; W/mhjax.json records where each came from):
``data.generator`` (the tokenized mixture), ``model.phi`` (softmax), ``train.loss`` (logistic:
softplus(-y Phi)), ``train.step_rule`` (constant: the member's ``step_size``). Before the first
step the rule is run on every step a member takes, and theta_0 is checked (mixture_checks.py).
L(theta_k) is recorded at ``train.loss_points`` log-spaced k (plus 0 and K) from the per-step
losses (``loss_curve``); ``MixtureRecipe.trace`` adds L, the normalised margin, ||grad L||/L and
||theta|| per step in-graph (W/trace; ``train.trace = False``: none). Results (``mixture_results``):
NTK margins, param_distance, head_spread, loss_slope, loss_zero_at_step, margin_loss_product;
``evaluate`` adds test loss, accuracy and the Hessian quantities at theta_K.
"""

from __future__ import annotations

import functools
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree

from mhjax.analysis import ntk
from mhjax.data import mixture_data
from mhjax.data.mixture_data import HostSampler
from mhjax.experiments import mixture_access, mixture_checks, mixture_config, mixture_results
from mhjax.experiments.base import Experiment, FigureRequest
from mhjax.experiments.constants import MixtureConstants
from mhjax.experiments.mixture_config import parts, plugin_sources, restore_plugins, setting, validate
from mhjax.models import classifier, mixture_parts
from mhjax.train.console import Column, SummaryTable
from mhjax.train.engine import Program, Recipe, TrainedProgram
from mhjax.train.members import Member, derive_key, expand, key_names


def own_steps(config, num_train: int) -> int:
    """A member's own K: train.steps, or round(steps_per_example * n) when that is set (> 0)."""
    per_example = float(config.train.get("steps_per_example", 0) or 0)
    return max(1, round(per_example * num_train)) if per_example > 0 else int(config.train.steps)


def loss_steps(total: int, points: int) -> list[int]:
    """k = 0 and about ``points`` log-spaced k in [1, total) (rounded, duplicates dropped)."""
    if points <= 0:
        return []
    ks = np.unique(np.round(np.geomspace(1, max(total, 1), points)).astype(np.int64))
    return [0] + [int(k) for k in ks if 0 < k < total]


def init_tau(config, member: Member) -> float:
    """The member's tau: its sweep.init_tau value when that is swept, else init.tau."""
    return float(member.hparams.get("init_tau", config.init.tau))


# Members differing only in these start from the same random draws (train/members.py: key_names):
# the same theta_0 directions at every step size and training-set size, scaled by each tau. With
# init.nested_heads, ``heads`` joins them: head h's draw then depends on (seed, h) only.
SHARED_DRAWS = ("init_tau", "step_size", "num_train")


# ---------------------------------------------------------------------- #
# Recipe: one member, traced
# ---------------------------------------------------------------------- #
class MixtureRecipe(Recipe):
    """The engine's recipe for every member of a mixture sweep (padded to ``max_heads`` heads
    and ``max_train`` examples)."""

    def __init__(self, config, max_heads: int, max_train: int):
        self.query = setting(config, "model.query")
        self.scheme = setting(config, "init.scheme")
        names = parts(config)
        self.attention = mixture_parts.get("phi", names["phi"]).fn
        self.margin_loss = mixture_parts.get("loss", names["loss"]).fn
        self.step_rule = mixture_parts.get("step_rule", names["step_rule"]).fn
        self.exponential_tail = mixture_parts.exponential_tail(names["loss"])
        first = setting(config, "init.first_step")
        self.takes_step = self.scheme == "zero_plus_step" or (first is not None and first > 0)
        self.lanczos_iters = int(setting(config, "analysis.lanczos_iters"))
        self.divergence_factor = float(setting(config, "train.divergence_factor"))
        self.traced = setting(config, "train.trace")  # MixtureRecipe.trace on
        self.max_heads, self.max_train = int(max_heads), int(max_train)
        self.shape = types.SimpleNamespace(dim=int(config.data.dim), seq_len=int(config.data.seq_len))

    # -- model pieces ---------------------------------------------------
    def phi(self, params, X, consts):
        return classifier.classifier_apply(params, X, consts.head_mask, consts.heads, self.query, self.attention)

    def apply_single(self, consts):
        """(params, x (T, d)) -> scalar Phi of this member (its own head mask and H)."""
        return lambda p, x: self.phi(p, x, consts)

    def train_loss(self, params, consts):
        """Mean loss over the member's own n examples (padding left out)."""
        return classifier.margin_loss(
            params,
            consts.X,
            consts.y,
            consts.head_mask,
            consts.heads,
            self.query,
            consts.weights,
            loss=self.margin_loss,
            phi=self.attention,
        )

    # -- engine protocol --------------------------------------------------
    def init_params(self, consts):
        base = "zero" if self.scheme == "zero_plus_step" else self.scheme
        key = jax.random.fold_in(consts.key, 0)
        params = classifier.init_params(
            key, self.shape, self.max_heads, base, consts.tau, query=self.query, head_mask=consts.head_mask
        )
        if self.takes_step:
            params, _ = classifier.gd_step(
                params,
                consts.X,
                consts.y,
                consts.first_step,
                consts.head_mask,
                consts.heads,
                self.query,
                consts.weights,
                loss=self.margin_loss,
                phi=self.attention,
            )
        return params

    def optimizer(self, consts):
        # The rule's step until the member's own K, then 0: members with different K share one program.
        rate = lambda count: jnp.where(count < consts.own_steps, self.step_rule(count, consts.step_size), 0.0)
        return optax.inject_hyperparams(optax.sgd)(learning_rate=rate)

    def loss(self, params, consts, step):
        return self.train_loss(params, consts), {}

    def trace(self, params, consts, loss, grads):
        """Per step (W/trace, ``run.trace``): L, the normalised margin min_i y_i Phi_i / ||theta||
        over the member's own examples, ||grad L|| / L and ||theta|| (padded heads are zero)."""
        if not self.traced:
            return {}
        theta, margins = jnp.linalg.norm(ravel_pytree(params)[0]), consts.y * self.phi(params, consts.X, consts)
        margin = jnp.min(jnp.where(consts.weights > 0, margins, jnp.inf)) / theta
        grad_ratio = jnp.linalg.norm(ravel_pytree(grads)[0]) / loss
        return {"loss": loss, "margin": margin, "grad_norm_over_loss": grad_ratio, "param_norm": theta}

    def evaluate(self, params, consts, step):
        """The member at theta_step: test and train loss and accuracy, the Hessian's extreme
        eigenvalues, eta_step lambda_max (the step rule's rate at this step), the distance from
        theta_0 and, under an exponential tail, the ratios to L."""
        test_margins = consts.y_test * self.phi(params, consts.X_test, consts)
        margins = consts.y * self.phi(params, consts.X, consts)
        loss_fn = functools.partial(self.train_loss, consts=consts)
        loss, grads = jax.value_and_grad(loss_fn)(params)
        grad_norm = jnp.linalg.norm(ravel_pytree(grads)[0])
        lam_min, lam_max = ntk.hessian_extreme_eigs(
            loss_fn, params, num_iters=self.lanczos_iters, key=jax.random.fold_in(consts.key, 1)
        )
        heads = jnp.asarray(consts.heads, jnp.float32)
        theta0 = self.init_params(consts)
        out = {
            "distance_from_init": jnp.linalg.norm(ravel_pytree(params)[0] - ravel_pytree(theta0)[0]),
            "test_loss": jnp.mean(self.margin_loss(test_margins)),
            "test_accuracy": jnp.mean(test_margins > 0),
            "train_loss_eval": loss,
            "train_accuracy": jnp.sum(consts.weights * (margins > 0)) / consts.num_train,
            "hessian_min": lam_min,
            "hessian_max": lam_max,
            "step_times_hessian_max": self.step_rule(step, consts.step_size) * lam_max,
        }
        if self.exponential_tail:  # ratios to L that the theory reads only under an exponential tail
            out["grad_norm_over_loss"] = grad_norm / loss
            out["min_hessian_eig_over_loss_sqrtH"] = jnp.sqrt(heads) * lam_min / loss
        return out


# ---------------------------------------------------------------------- #
# Experiment: members, constants, results, figures
# ---------------------------------------------------------------------- #
class MixtureExperiment(Experiment):
    kind = "mixture"
    cannot_extend = (
        "a mixture sweep cannot train longer, as its K (train.steps, or steps_per_example * n) and recorded "
        "loss steps are set by the total; use a new workdir"
    )
    analyzes_states, log_every_step = True, True  # TensorBoard's train/loss: every step W/trace keeps
    curve_style, log_curves = "step_size", ("loss", "hessian")  # rates as slopes, step sizes apart
    curve_colour = "step_size"  # a colour and a style per step size; the head count is the marker
    config_defaults, source_label = mixture_config.DEFAULTS, staticmethod(mixture_config.source_label)

    def __init__(self, config):
        validate(config)
        self.config = config
        # init_tau and init_scheme join every member's hparams (results.json, HParams) even when not swept.
        self.members: list[Member] = [
            Member(
                m.name, {**m.hparams, "init_tau": init_tau(config, m), "init_scheme": setting(config, "init.scheme")}
            )
            for m in expand(dict(config.sweep))
        ]
        nested = ("heads",) if setting(config, "init.nested_heads") else ()  # head h's draw: (seed, h) only
        self._key_names = key_names(config.sweep, self.members, shared=SHARED_DRAWS + nested)
        self.max_heads = max(m["heads"] for m in self.members)
        self.max_train = max(m["num_train"] for m in self.members)
        self._train_data, self._test_data = {}, {}  # seed -> (X, y): sampled once per experiment

    @classmethod
    def restore_plugins(cls, metadata: dict, where: str) -> None:
        restore_plugins(metadata.get("mixture"), where)

    @classmethod
    def stored_params(cls, record: dict, params):
        """Cut to the member's own heads: checkpoints hold them padded to H_max."""
        return mixture_access.unpad(params, int(record["heads"]))

    # -- a trained run from Python (mixture_access.py) ------------------------
    def seed_data(self, seed: int):
        return mixture_access.data(self, seed)

    def theta0(self, name: str):
        return mixture_access.theta0(self, name)

    def model(self, name: str):
        return mixture_access.model(self, name)

    def ntk(self, name: str, padded_params, step: int):
        params = mixture_access.padded_theta0(self, name) if padded_params is None else padded_params
        return mixture_access.ntk(self, name, params, step)

    def analyze_states(self, states: dict, log=None):
        theta0 = mixture_access.padded_theta0s(
            self, sorted({n for m in states.values() for n, p in m.items() if p is None})
        )
        states = {
            step: {n: theta0[n] if p is None else p for n, p in members.items()} for step, members in states.items()
        }
        return mixture_access.analyze(self, states, log)

    # -- data --------------------------------------------------------------
    def data_key(self, seed: int):
        return derive_key(self.config.seed, seed, "mixture-data")

    def test_key(self, seed: int):
        return derive_key(self.config.seed, seed, "mixture-test")

    @functools.cached_property
    def _sampler(self):
        return HostSampler(self.config.data)

    def train_data(self, seed: int):
        """The seed's first max_train training examples as numpy (X, y), sampled once per seed."""
        if seed not in self._train_data:
            self._train_data[seed] = self._sampler(self.data_key(seed), self.max_train)
        return self._train_data[seed]

    def test_data(self, seed: int):
        """The seed's data.num_test test examples (a separate key: fresh draws) as numpy (X, y)."""
        if seed not in self._test_data:
            self._test_data[seed] = self._sampler(self.test_key(seed), int(self.config.data.num_test), "test")
        return self._test_data[seed]

    # -- engine protocol ---------------------------------------------------
    def member_constants(self, member: Member) -> MixtureConstants:
        X, y = self.train_data(member["seed"])
        X_test, y_test = self.test_data(member["seed"])
        n, eta = member["num_train"], float(member["step_size"])
        first = setting(self.config, "init.first_step")
        return MixtureConstants(
            key=derive_key(self.config.seed, member["seed"], self._key_names[member.name]),
            tau=np.float32(member["init_tau"]),
            X=X,
            y=y,
            X_test=X_test,
            y_test=y_test,
            weights=(np.arange(self.max_train) < n).astype(np.float32),
            num_train=np.float32(n),
            heads=np.int32(member["heads"]),
            head_mask=(np.arange(self.max_heads) < member["heads"]).astype(np.float32),
            step_size=np.float32(eta),
            first_step=np.float32(eta if first is None else first),
            own_steps=np.int32(own_steps(self.config, n)),
        )

    def layout(self, strategy: str, attention, devices: int):
        """One program for every member (head counts padded to H_max, training sets to n_max),
        whatever the strategy."""
        recipe = MixtureRecipe(self.config, self.max_heads, self.max_train)
        return [Program("all", list(range(len(self.members))), recipe)]

    def divergence_factor(self) -> float:
        return float(setting(self.config, "train.divergence_factor"))

    def member_info(self, member: Member) -> dict:
        d, t, h = self.config.data.dim, self.config.data.seq_len, member["heads"]
        per_head = d * d + (t * d if setting(self.config, "model.query") == "full" else d)
        return {"params": h * per_head, "own_steps": own_steps(self.config, member["num_train"])}

    def metadata(self) -> dict:
        """W/mhjax.json's "mixture": where its data generator, phi, loss and step rule came from (restore_plugins)."""
        return {"mixture": plugin_sources(self.config)}

    def check_start(self) -> None:
        """The step rule at every step each member takes, then theta_0 (mixture_checks.py)."""
        mixture_checks.check_step_rule(self)
        mixture_checks.check_theta0(self)

    # -- results ---------------------------------------------------------
    def eval_steps(self) -> list[int]:
        """Evaluation (test loss, Hessian, distance) at k = 0 and log-spaced k (the end of the
        chunk containing k), besides every train.eval_every steps."""
        return loss_steps(int(self.config.train.steps), int(self.config.train.get("eval_points", 0) or 0))

    def loss_steps(self) -> list[int]:
        return loss_steps(int(self.config.train.steps), int(self.config.train.get("loss_points", 0) or 0))

    def extra_results(self, trained: list[TrainedProgram], loss_curves: dict[int, dict]) -> dict:
        return mixture_results.extra_results(self, trained, loss_curves)

    def summary_table(self) -> SummaryTable:
        return SummaryTable(
            self.swept_fields("num_train", "heads"),
            (
                Column("train loss", "train_loss_eval"),
                Column("train accuracy", "train_accuracy", percent=True),
                Column("test loss", "test_loss"),
                Column("test accuracy", "test_accuracy", percent=True),
            ),
        )

    def metric_tags(self) -> list[str]:
        return [
            f"eval/{k}"
            for k in (
                "test_loss",
                "test_accuracy",
                "train_accuracy",
                "grad_norm_over_loss",
                "min_hessian_eig_over_loss_sqrtH",
                "step_times_hessian_max",
                "distance_from_init",
            )
        ]

    def figures(self, payload: dict) -> list[FigureRequest]:
        """Figures (PNG) and mixture_summary.md (plotting/mixture.py); a sweep over several init_tau
        gets the init comparison instead (mixture_init.md, test_accuracy_vs_H.png): the rate and
        margin figures average over members and would mix the scales."""
        scheme = setting(self.config, "init.scheme")
        if len(self.config.sweep.get("init_tau", ())) > 1:
            return [FigureRequest("mixture_init", {"records": payload["members"], "scheme": scheme})]
        loss, generator = setting(self.config, "train.loss"), setting(self.config, "data.generator")
        data = {
            "records": payload["members"],
            "chunk_steps": int(self.config.train.chunk_steps),
            "init": scheme,
            "loss": loss,
            "exponential_tail": mixture_parts.exponential_tail(loss),
            "generator": None if generator == mixture_data.DEFAULT_GENERATOR else generator,
            "step_rule": setting(self.config, "train.step_rule"),
            "slope_window": list(setting(self.config, "analysis.slope_window")),
        }
        return [FigureRequest("mixture", data)]
