"""The start of a mixture run checked before training: the step rule at every step each member
takes (``check_step_rule``), and every member's loss, gradient and NTK Gram at theta_0 finite.

A value that overflows at theta_0 would otherwise train quietly into numbers that mean nothing:
at init.tau = 1e30 the loss and the gradient are finite but the Gram overflows, and the margin
came out as 0.0 with status "ok". A failure is one ConfigError naming the likely field: the init
scale when the same member is finite at tau <= 1, else the attention map (model.phi), the loss
(train.loss) or the first GD step (init.first_step / sweep.step_size). One compiled program for
all members (the members' axis mapped), run once; the diagnosis reruns it with tau capped at 1
(the same shapes: no second compile).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.analysis import ntk
from mhjax.config import ConfigError
from mhjax.experiments.mixture_config import setting
from mhjax.models import mixture_parts
from mhjax.train.loop import stack_constants

CHECKS = ("Phi", "loss", "gradient", "NTK Gram")


def _finite(tree) -> jax.Array:
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree_util.tree_leaves(tree)]))


def start_values(recipe, consts):
    """(Phi, loss, gradient, Gram) finite at theta_0 of one member: 4 booleans."""
    theta0 = recipe.init_params(consts)
    loss, grads = jax.value_and_grad(recipe.train_loss)(theta0, consts)
    gram = ntk.ntk_gram(recipe.apply_single(consts), theta0, consts.X, chunk_size=min(64, recipe.max_train))
    phi = recipe.phi(theta0, consts.X, consts)
    return jnp.stack([_finite(phi), jnp.isfinite(loss), _finite(grads), _finite(gram)])


def check_step_rule(experiment) -> None:
    """ConfigError naming the rule, the step size and the first bad step unless the step rule is
    finite and >= 0 at every step 0..K-1 of each member's own K with its own step size, and > 0 at
    one (models/mixture_parts.check_step_rule)."""
    runs = [(m["step_size"], experiment.member_info(m)["own_steps"]) for m in experiment.members]
    mixture_parts.check_step_rule(setting(experiment.config, "train.step_rule"), runs)


def check_theta0(experiment) -> None:
    """ConfigError naming the likely field when a member's Phi, loss, gradient or NTK Gram at
    theta_0 is not finite."""
    (program,) = experiment.programs("auto", jax.default_backend())
    recipe = program.recipe
    consts = stack_constants(experiment, program.members)
    run = jax.jit(lambda c: jax.lax.map(lambda one: start_values(recipe, one), c))
    ok = np.asarray(run(consts))
    bad = np.flatnonzero(~ok.all(axis=1))
    if not bad.size:
        return
    j = int(bad[0])
    member = experiment.members[program.members[j]]
    failed = [name for name, good in zip(CHECKS, ok[j]) if not good]
    what = f"theta_0 of member {member.name} gives a non-finite {' and '.join(failed)}"
    tau = float(consts.tau[j])
    if tau > 1:
        capped = consts._replace(tau=np.minimum(consts.tau, np.float32(1.0)))
        if np.asarray(run(capped))[j].all():
            field = "sweep.init_tau" if "init_tau" in experiment.config.sweep else "init.tau"
            raise ConfigError(f"config.{field}: {what} at tau = {tau:g} (finite at tau = 1); use a smaller tau")
    if not ok[j][0]:
        field = "model.phi"
    elif not ok[j][1]:
        field = "train.loss"
    elif recipe.takes_step:
        field = "init.first_step" if experiment.config.init.get("first_step") is not None else "sweep.step_size"
    else:
        field = "model.phi"
    raise ConfigError(f"config.{field}: {what} (tau = {tau:g})")
