"""Section 4 of 'Beyond Parallelism' at T = 100 x 3 seeds, 1,000 steps: 1 h 24 min on 2 CPU cores (measured).

"Beyond Parallelism: Synergistic Computational Graph Effects in Multi-Head Attention"
(arXiv 2507.02944), Section 4: copy and cycle, heads 1/4/8/16 at width 64 (172,800
parameters each), 4 pre-norm layers, MLP 128, vocabulary 256, Adam 1e-3, batch 50, dropout
0.1, 5,000 fixed sequences reshuffled every epoch. Three seeds instead of one, and 1,000
steps (10 epochs) instead of 20,000, so that the whole run fits a 2-core CPU.
configs/paper.py is the full 20,000-step protocol, for accelerators.

Measured on 2026-12-03: `mhjax train --config configs/paper_cpu.py` took 1 h 24 min (5,087 s) of wall time on a
shared 2-core machine with other jobs running (docs/reproduction.md).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import paper  # noqa: E402


def get_config():
    config = paper.get_config()
    config.sweep.seed = (0, 1, 2)
    config.data.num_eval = 500
    config.train.steps = 1000
    config.train.chunk_steps = 50  # train/loss is logged every step of a chunk of up to 50 steps
    config.train.eval_every = 100  # held-out loss and accuracy along training
    config.train.checkpoint_every = 200
    return config
