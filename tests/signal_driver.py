"""Runs ``mhjax`` (cli.main, argv as the command's) with one signal sent to itself at one moment
of the training, for the elastic-resume and chaos tests (tests/test_distributed.py,
tests/test_chaos.py). No timing: the moment is a call of the code that does it.

Environment:

* ``MHJAX_TEST_SIGNAL``: SIGTERM, SIGUSR1, SIGUSR2, SIGINT or SIGKILL (SIGKILL: the process dies
  there, with no handler, flush or cleanup);
* ``MHJAX_TEST_AT``: the moment, once:
  - ``chunk:N``: the N-th training chunk (1-based, every program's counted) dispatched, its
    results not fetched yet;
  - ``save:FOLDER:STEP``: orbax has written FOLDER/STEP (``checkpoints`` or ``snapshots``) to its
    temporary folder and is about to rename it into place;
  - ``flush:N``: inside the N-th TensorBoard flush of the training loop (MemberWriters.flush
    called from train/loop.py: before every checkpoint commit), before the events are written out;
* ``MHJAX_TEST_ALSO``: optional, a pid that gets the same signal just before this process (the
  SLURM batch shell, which SLURM signals with the step at the time limit: tests/test_launch.py).
"""

import os
import signal
import sys

SIGNAL = signal.Signals[os.environ["MHJAX_TEST_SIGNAL"]]
WHAT, *WHERE = os.environ["MHJAX_TEST_AT"].split(":")
sent = [False]


def send() -> None:
    if not sent[0]:  # once: a second signal would exit at once
        sent[0] = True
        if os.environ.get("MHJAX_TEST_ALSO"):
            os.kill(int(os.environ["MHJAX_TEST_ALSO"]), SIGNAL)
        os.kill(os.getpid(), SIGNAL)


if WHAT == "chunk":
    from mhjax.train.loop import Sweep

    original_run_chunk, calls = Sweep.run_chunk, [0]

    def run_chunk(self, *args, **kwargs):
        out = original_run_chunk(self, *args, **kwargs)
        calls[0] += 1
        if calls[0] == int(WHERE[0]):
            send()
        return out

    Sweep.run_chunk = run_chunk
elif WHAT == "save":
    from orbax.checkpoint._src.path import atomicity

    original_finalize = atomicity.AtomicRenameTemporaryPath.finalize
    folder, step = WHERE

    async def finalize(self, *args, **kwargs):
        if self._final_path.name == step and self._final_path.parent.name == folder:
            send()
        return await original_finalize(self, *args, **kwargs)

    atomicity.AtomicRenameTemporaryPath.finalize = finalize
elif WHAT == "flush":
    from mhjax.io.tensorboard import MemberWriters

    original_flush, flushes = MemberWriters.flush, [0]
    LOOP = os.path.join("train", "loop.py")

    def flush(self, *args, **kwargs):
        if sys._getframe(1).f_code.co_filename.endswith(LOOP):  # the loop's, before a checkpoint (not start's)
            flushes[0] += 1
            if flushes[0] == int(WHERE[0]):
                send()
        return original_flush(self, *args, **kwargs)

    MemberWriters.flush = flush
else:
    raise SystemExit(f"MHJAX_TEST_AT: chunk:N, save:FOLDER:STEP or flush:N (got {os.environ['MHJAX_TEST_AT']})")

from mhjax.cli import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
