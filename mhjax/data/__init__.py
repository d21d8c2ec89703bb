from mhjax.data.sequences import PROTOCOLS, TASKS, eval_batch, targets_for, train_batch

__all__ = ["PROTOCOLS", "TASKS", "eval_batch", "targets_for", "train_batch"]
