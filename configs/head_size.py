"""Heads 1/4/16 parameter-matched and at head size 16 on sorting, induction and recall (2 CPU cores).

configs/tasks.py's model (2 layers, width 64, MLP 128, length 32, vocabulary 32, fresh batches,
Adam 3e-3, 1,000 steps, three seeds) at heads 1, 4 and 16, twice: head_dim None (parameter
matching: head size 64 / H, so 64, 16 and 4) and head_dim 16 (attention width 16 x H, so 16, 64
and 256; parameters and FLOPs grow with H). At H = 4 the two designs are one model (head size
16), so config.sweep_skip trains it once, as the matched member; benchmarks/studies/head_size_table.py
reads it for both. 45 members; docs/head_size.md has the measured time on 2 CPU cores."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import tasks  # noqa: E402


def get_config():
    config = tasks.get_config()
    config.sweep.task = ("sorting", "induction", "recall")  # docs/tasks.md: where heads matter
    config.sweep.heads = (1, 4, 16)
    config.sweep.head_dim = (None, 16)  # None: head size = width / heads; 16: a fixed head size
    config.sweep_skip = ({"head_dim": 16, "heads": 4},)  # = head_dim None at H = 4 (64 / 4 = 16)
    return config
