"""Section 4 of 'Beyond Parallelism' (arXiv 2507.02944) in full: T = 100, 20,000 Adam steps (accelerators)."""

import ml_collections


def get_config():
    config = ml_collections.ConfigDict()
    config.experiment = "sequence"
    config.seed = 0
    config.strategy = "auto"  # auto | unrolled | fused | grouped | one_program (README: Sweep strategies)
    config.attention = "auto"  # auto | jax | cpu_kernel | pallas (README: Attention implementations)
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
    # Every member's parameters kept for good at step 0 and 7 log-spaced steps up to the last
    # (0, 1, 5, 27, 141, 737, 3839, 20000, each exact: train/snapshots.py): 675 KiB
    # per member and snapshot, 42 MiB in all; `mhjax analyze --steps all` analyses each.
    config.train.snapshot_steps = "log:8"
    return config
