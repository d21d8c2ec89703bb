"""Heads 1/2/4 on the first_token task of my_task.py: `mhjax train --config examples/my_task_config.py`."""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import my_task  # noqa: E402, F401  (registers "first_token", "previous_token"; mhjax.json records where)


def get_config():
    config = ml_collections.ConfigDict()
    config.experiment = "sequence"
    config.seed = 0
    config.strategy = "auto"
    config.sweep = ml_collections.ConfigDict(
        dict(task=("first_token",), heads=(1, 2, 4), seed=(0,), learning_rate=(3e-3,))
    )
    config.model = ml_collections.ConfigDict(
        dict(width=32, num_layers=1, mlp_dim=64, vocab_size=16, seq_len=16, dropout=0.0)
    )
    config.data = ml_collections.ConfigDict(dict(protocol="fresh", num_train=256, batch_size=32, num_eval=128))
    config.train = ml_collections.ConfigDict(dict(steps=300, chunk_steps=50, eval_every=50, checkpoint_every=100))
    return config
