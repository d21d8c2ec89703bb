"""Do more heads help a small character model, each head count at its best learning rate?

configs/text_heads.py's model and data (builtin:stdlib bytes, the last 10 % held out; width 64,
2 layers, MLP 256, T = 64, heads 1/2/4/8 parameter-matched; AdamW with a linear warmup and a
cosine decay to 1e-4, weight decay 0.1, clipping at norm 1), with the learning rate swept over a
grid bracketing 3e-3 and ``compare.tune = ("learning_rate",)``: per head count the rate of the
lowest mean validation loss over the seeds is selected, and head counts are compared on the test
windows at their selections (analysis/comparisons.py). 5 seeds: Student's t at 4 degrees of
freedom (2.78) leaves room for a verdict. Shorter than text_heads.py (STEPS, and 512 held-out
windows in each set) so that its 60 members finish in about half an hour on this repository's
2-core machine shared with other jobs (measured: 71 ms of wall time per member-step there, at a
load average of ~11): docs/text_heads.md, "At their best learning rates" (the measured time and
the answer). Run with MHJAX_IMAGES=0 to skip the end-of-training attention images (~3 s a member)."""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(__file__))
import text_heads  # noqa: E402

STEPS = 400


def get_config():
    config = text_heads.get_config()  # its model, data and optimizer; the grid, seeds and length here
    config.sweep.seed = (0, 1, 2, 3, 4)
    config.sweep.learning_rate = (1e-3, 3e-3, 1e-2)
    config.compare = ml_collections.ConfigDict(dict(tune=("learning_rate",)))
    config.data.num_eval = 512
    config.train = ml_collections.ConfigDict(
        dict(steps=STEPS, chunk_steps=STEPS // 2, eval_every=STEPS // 2, checkpoint_every=STEPS // 2)
    )
    config.train.schedule = "warmup_cosine"
    config.train.warmup_steps = 50
    config.train.min_learning_rate = 1e-4
    config.train.weight_decay = 0.1
    config.train.clip_norm = 1.0
    return config
