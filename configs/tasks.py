"""Heads 1/2/4/8/16 on four tasks that exercise attention heads: multi-query associative recall,
induction heads, reversal and sorting (mhjax/data/head_tasks.py), sized to run on 2 CPU cores.

A 2-layer model (width 64, so 16 heads have 4 dimensions each) on sequences of length 32
over a 32-token vocabulary, fresh batches every step, evaluated every 50 steps (when each
head count learns a task is the measure), three seeds: 60 members, ~10 minutes on 2 CPU
cores. README: "Tasks where heads matter"."""

import ml_collections


def get_config():
    config = ml_collections.ConfigDict()
    config.experiment = "sequence"
    config.seed = 0
    config.strategy = "auto"
    config.sweep = ml_collections.ConfigDict()
    config.sweep.task = ("recall", "induction", "reversal", "sorting")
    config.sweep.heads = (1, 2, 4, 8, 16)
    config.sweep.seed = (0, 1, 2)
    config.sweep.learning_rate = (3e-3,)
    config.model = ml_collections.ConfigDict(
        dict(width=64, num_layers=2, mlp_dim=128, vocab_size=32, seq_len=32, dropout=0.0)
    )
    config.data = ml_collections.ConfigDict(dict(protocol="fresh", num_train=1024, batch_size=32, num_eval=512))
    config.train = ml_collections.ConfigDict(dict(steps=1000, chunk_steps=50, eval_every=50, checkpoint_every=500))
    return config
