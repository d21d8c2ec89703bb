"""configs/text_heads_tuned.py with successive halving: one rung at half the steps, keep 1/3 (Ray
Tune's reduction_factor 3), per head count (docs/sweeps.md "Successive halving").

Measured on 2026-12-06 against the full grid's run: 16,000 of its 24,000 member-steps (67 %), the
same learning rate selected at every head count, the survivors' numbers bit for bit the full run's
(docs/text_heads.md "With successive halving"; benchmarks/RESULTS.md "Successive halving").
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
import text_heads_tuned  # noqa: E402


def get_config():
    config = text_heads_tuned.get_config()
    config.train.halving = dict(rungs=(text_heads_tuned.STEPS // 2,), keep=1 / 3)
    return config
