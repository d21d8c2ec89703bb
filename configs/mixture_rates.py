"""Training rate of GD on the tokenized mixture (arXiv 2310.12680): train loss vs K up to 10,000, per H (CPU, minutes).

Paper: arXiv 2310.12680 (predicted rate L ~ 1/(gamma^2 eta K) once
H is past a threshold). 24 members (H in 1, 4, 16, 64 x eta in 0.1, 0.3, 1 x 2 seeds, n = 32)
in ONE compiled program (heads padded to 64 and masked), K = 10,000 plain full-batch GD steps
from the default theta_0 (random decoders U_h ~ N(0, tau^2) with tau = 0.1, W = 0: heads differ). The exact
L(theta_k) is recorded at ~40 log-spaced k (results field loss_curve, no extra device work):
loss_slope is its log-log slope over the last decade [K/10, K] and margin_loss_product =
gamma^2 eta K L(theta_K). Along the path (item "GD path"): ||theta_k - theta_0||,
sqrt(H) lambda_min / L (64 Lanczos steps) and eta lambda_max at 12 log-spaced k and k = 0.

Sizes are small so that 240,000 member-steps fit the CPU budget: T = 4 tokens (2 relevant),
d = 6 (the least for 1 relevant cluster per label and 4 noise clusters). H = 256 is left out
here: padding makes every member cost H_max, which would quadruple the run; the NTK margin at
H = 256 is measured by configs/mixture_margin.py.
The three step sizes of a seed start from the same theta_0 (the key leaves eta out), so the rates
are compared on paired runs. Measured at tau = 0.1 (`time mhjax train --config configs/mixture_rates.py
--workdir /tmp/rates --no-progress`, 2 free CPU cores): 2 min 20 s wall, of which 126 s training at
1,904 member-steps/s (with 7 evaluations of 64 Lanczos steps); 10 min 7 s under a load of 8-14 before.
Stability edge (mixture_summary.md; path.png draws the first eta): at tau = 0.1 only eta = 1 starts
above it (eta lambda_max(theta_0) = 2.4-5.9, below 2 from k = 250 on); eta = 0.1 and 0.3 stay below
it throughout (0.24-1.78 at theta_0). At tau = 1 (the default before) every eta started above it
(5-12 at eta = 0.1).
"""

import ml_collections

from mhjax.data.mixture import default_mixture_config


def get_config():
    config = ml_collections.ConfigDict()
    config.experiment = "mixture"
    config.seed = 0
    config.strategy = "auto"
    config.devices = 0

    config.sweep = ml_collections.ConfigDict()
    config.sweep.heads = (1, 4, 16, 64)
    config.sweep.seed = (0, 1)
    config.sweep.num_train = (32,)
    config.sweep.step_size = (0.1, 0.3, 1.0)

    config.data = default_mixture_config()
    config.data.dim, config.data.seq_len, config.data.relevant_fraction = 6, 4, 0.5
    config.data.num_test = 1000

    config.model = ml_collections.ConfigDict()
    config.model.query = "full"

    config.init = ml_collections.ConfigDict()
    config.init.scheme = "random_decoders"
    config.init.tau = 0.1  # configs/mixture.py's default (chosen with configs/mixture_init.py; 1.0 before)
    config.init.first_step = ml_collections.FieldReference(None, field_type=float)

    config.analysis = ml_collections.ConfigDict()
    config.analysis.lanczos_iters = 64
    config.analysis.margin_iters = 20000
    config.analysis.margin_tol = 1e-4

    config.train = ml_collections.ConfigDict()
    config.train.steps = 10_000
    config.train.chunk_steps = 250
    config.train.eval_every = 0  # evaluations only at the eval_points below and at K
    config.train.eval_points = 12
    config.train.loss_points = 40
    config.train.checkpoint_every = 2500
    return config
