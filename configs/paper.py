"""Section 4 of 'Beyond Parallelism' (arXiv 2507.02944) in full: T = 100, 20,000 Adam steps (accelerators)."""

import ml_collections


def get_config():
    config = ml_collections.ConfigDict()
    config.experiment = "sequence"
    config.seed = 0
    config.strategy = "auto"  # auto | unrolled | fused | grouped | one_program (README: Sweep strategies)
    config.devices = 0  # devices the member axis is sharded over; 0 = all
    config.sweep = ml_collections.ConfigDict()
    config.sweep.task = ("copy", "cycle")
    config.sweep.heads = (1, 4, 8, 16)
    config.sweep.seed = (0,)
    config.sweep.learning_rate = (1e-3,)
    config.model = ml_collections.ConfigDict(
        dict(width=64, num_layers=4, mlp_dim=128, vocab_size=256, seq_len=100, dropout=0.1)
    )
    config.data = ml_collections.ConfigDict(dict(protocol="fixed", num_train=5000, batch_size=50, num_eval=500))
    config.train = ml_collections.ConfigDict(dict(steps=20000, chunk_steps=200, eval_every=1000, checkpoint_every=2000))
    return config
