"""The init scale against H on the tokenized mixture (arXiv 2310.12680): H 1..64 x tau 0..1 x n 32, 128 x 3 seeds.

H in 1, 4, 16, 64 x tau in 0, 0.001, 0.01, 0.1, 1 x n in 32, 128 x 3 seeds (CPU, minutes).

Issue 25: with random decoders of std tau = 1 the function Phi(theta_0) (of size ~ tau |mean token|,
independent of H under the 1/sqrt(H) output scale) is fitted around rather than removed, so the
init's scale and not H decided the test accuracy. This sweep measures that: 120 members in ONE
compiled program (tau a per-member constant, ``sweep.init_tau``; members differing only in tau
share their random directions), otherwise configs/mixture.py's data, model, eta = 1 and K = 150.
tau = 0 is zero init without a step: every head the same (head_spread 0), the symmetric reference.
Outputs: mixture_init.md (test accuracy and loss, train loss, head_spread at theta_0 and theta_K,
NTK margin and NTK margin / radius per (n, tau, H)) and test_accuracy_vs_H.png (a line per tau).
The Hessian is evaluated only at theta_K with 8 Lanczos steps (it is not what this sweep is about).

Reference, the paper's own init (zero init + one GD step; every head identical): the same sweep with
zero_plus_step and no tau axis (tau plays no part there), 24 members:
  mhjax train --config configs/mixture_init.py --workdir runs/mixture_init_zps \\
      --config.init.scheme=zero_plus_step --config.sweep.init_tau='(1.0,)'
(a single tau value: the usual mixture figures and mixture_summary.md are written).
Measured on 2 free CPU cores: 2 min 48 s wall (158 s in the loop); 18 min 55 s under a load of 12-17
before; the reference 3 min 55 s under that load. Results and the choice of configs/mixture.py's
tau = 0.1: README ("Mixture: the init scale").
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import mixture  # noqa: E402


def get_config():
    config = mixture.get_config()
    config.sweep.heads = (1, 4, 16, 64)
    config.sweep.init_tau = (0.0, 0.001, 0.01, 0.1, 1.0)
    config.init.scheme = "random_decoders"
    config.init.first_step = None
    config.analysis.lanczos_iters = 8
    config.train.eval_every = 0  # evaluation at theta_K only
    return config
