"""The main job: Section 4 of 'Beyond Parallelism' at length 32, 200 steps, one seed: a few minutes on 2 CPU cores.

The paper's model (width 64, 4 layers, MLP 128, vocab 256) on sequences of length 32
instead of 100 and 200 steps instead of 20,000, so it fits a laptop CPU."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import paper  # noqa: E402


def get_config():
    config = paper.get_config()
    config.model.seq_len = 32
    config.data.num_eval = 200
    config.train.steps = 200
    config.train.chunk_steps = 25  # evaluations happen between chunks: 8 held-out points on the curves
    config.train.eval_every = 25
    config.train.checkpoint_every = 100
    return config
