from mhjax.data import head_tasks  # noqa: F401  (registers recall, induction, reversal, sorting)
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
