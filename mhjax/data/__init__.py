# registering the built-in tasks: recall, induction, reversal, sorting; text (over config.data.path)
from mhjax.data import head_tasks, text  # noqa: F401
from mhjax.data.sequences import PROTOCOLS, TASKS, eval_batch, targets_for, train_batch
from mhjax.data.tasks import Batch, Task, get_task, register_task, registered, task

__all__ = [
    "PROTOCOLS",
    "TASKS",
    "Batch",
    "Task",
    "eval_batch",
    "get_task",
    "register_task",
    "registered",
    "targets_for",
    "task",
    "train_batch",
]
