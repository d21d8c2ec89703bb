"""NTK margin at theta_0 as H grows (arXiv 2310.12680): H in 1..256 x 6 seeds, n = 32, default theta_0 (CPU, minutes).

With random decoders (the default theta_0) the NTK Gram at theta_0 is an average over H
independent random heads, so the margin should converge as H grows and its spread over seeds
shrink (arXiv 2310.12680). Only theta_0 matters here: K = 1 GD step (the trainer needs one), and the
figure ntk_margin_vs_H.png shows mean and std over the 6 seeds per H. Same data sizes as
configs/mixture_rates.py (T = 4, d = 6). Seeds vary both the data and theta_0, so the std over
seeds keeps the data's share however large H is.
Measured at tau = 0.1 (2 CPU cores shared with ~8 other jobs, an upper bound): 1 min 10 s wall.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(__file__))
import mixture_rates  # noqa: E402


def get_config():
    config = mixture_rates.get_config()
    config.sweep.heads = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    config.sweep.seed = (0, 1, 2, 3, 4, 5)
    config.sweep.step_size = (1.0,)
    config.analysis.lanczos_iters = 8
    config.train = ml_collections.ConfigDict(
        dict(steps=1, chunk_steps=1, eval_every=0, eval_points=0, loss_points=0, checkpoint_every=1)
    )
    return config
