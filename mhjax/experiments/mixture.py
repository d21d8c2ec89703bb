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

theta_0 and training: mixture_recipe.py (init.scheme, full-batch GD with the plug-ins, the
per-step trace, the evaluation at theta_K). Results (``mixture_results``): NTK margins,
param_distance, head_spread, loss_slope, loss_zero_at_step, margin_loss_product.
"""

from __future__ import annotations

import functools

import numpy as np

from mhjax.data import mixture_data
from mhjax.data.mixture_data import HostSampler
from mhjax.experiments import mixture_access, mixture_checks, mixture_config, mixture_recipe, mixture_results
from mhjax.experiments.base import Experiment, FigureRequest
from mhjax.experiments.constants import MixtureConstants
from mhjax.experiments.mixture_config import plugin_sources, restore_plugins, setting, validate
from mhjax.models import mixture_parts
from mhjax.train.console import Column, SummaryTable
from mhjax.train.engine import Program, TrainedProgram
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
        recipe = mixture_recipe.MixtureRecipe(self.config, self.max_heads, self.max_train)
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
