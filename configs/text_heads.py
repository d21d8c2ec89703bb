"""Do more heads help a small character model? Heads 1/2/4/8 at width 64 on builtin:stdlib, 3 seeds.

The running Python's standard-library sources as bytes (data.path=builtin:stdlib, built, cached
and hashed by mhjax: data/python_corpora.py; nothing to download), the last 10 % held out. A
byte-level model (vocab 256), width 64 for every head count (Q, K, V and O are 64 x 64: the
members are parameter-matched and differ only in how attention is split; 8 heads: 8 dimensions
each), 2 layers, MLP 256, T = 64. Batch 32 windows, 1,500 steps of AdamW at 3e-3 with a linear
warmup (100 steps) and a cosine decay to 1e-4, weight decay 0.1, gradients clipped to norm 1;
members of a seed draw the same training windows; held-out loss on 1,024 windows every 250 steps;
snapshots every 250 steps for `mhjax analyze --steps all`. Sized for 15 minutes on 2 idle CPU
cores: docs/text_heads.md (the pilot, the corpus of the Python used, the results)."""

import ml_collections


def get_config():
    config = ml_collections.ConfigDict()
    config.experiment = "sequence"
    config.seed = 0
    config.strategy = "auto"
    config.sweep = ml_collections.ConfigDict()
    config.sweep.task = ("text",)
    config.sweep.heads = (1, 2, 4, 8)
    config.sweep.seed = (0, 1, 2)
    config.sweep.learning_rate = (3e-3,)
    config.model = ml_collections.ConfigDict(
        dict(width=64, num_layers=2, mlp_dim=256, vocab_size=256, seq_len=64, dropout=0.0)
    )
    # builtin:stdlib: the corpus every machine has (its bytes depend on the Python version; the
    # run records its sha256 and the Python in mhjax.json and results.json)
    config.data = ml_collections.ConfigDict(
        dict(path="builtin:stdlib", holdout=0.1, protocol="fresh", num_train=1024, batch_size=32, num_eval=1024)
    )
    config.train = ml_collections.ConfigDict(dict(steps=1500, chunk_steps=250, eval_every=250, checkpoint_every=500))
    config.train.snapshot_steps = (250, 500, 750, 1000, 1250)  # chunk ends: no extra program
    config.train.schedule = "warmup_cosine"
    config.train.warmup_steps = 100
    config.train.min_learning_rate = 1e-4
    config.train.weight_decay = 0.1
    config.train.clip_norm = 1.0
    return config
