"""The mixture sweep's recipe: one member traced (experiments/mixture.py says what the sweep is).

theta_0. ``init.scheme`` (head h's random values from fold_in(member key, h): independent
of H_max; ``init.tau`` is their standard deviation, or the member's ``sweep.init_tau`` value when
that is swept: tau is a per-member constant of the one program. tau, eta and n stay out of the
key (mixture.SHARED_DRAWS), so members differing only in those start from the same random directions,
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
import optax
from jax.flatten_util import ravel_pytree

from mhjax.analysis import ntk
from mhjax.experiments.mixture_config import parts, setting
from mhjax.models import classifier, mixture_parts
from mhjax.train.engine import Recipe


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
