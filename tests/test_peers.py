"""Which errors of a run of several processes mean a lost process (train/peers.py), and the one
line and exit code a survivor leaves with. Two real processes and a kill -9: tests/test_distributed.py."""

import pytest

from mhjax.config import ConfigError
from mhjax.train import peers
from mhjax.train.interrupt import EXIT_REQUEUE

GLOO = (
    "UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/tcp/pair.cc:547] Connection closed by peer "
    "[127.0.0.1]:8885\nmore detail"
)


@pytest.mark.parametrize(
    "exc, processes, want",
    [
        (ValueError(GLOO), 2, True),
        (
            RuntimeError("INTERNAL: Barrier failed because: task is set to ERROR: UNAVAILABLE: heartbeat timeout"),
            2,
            True,
        ),
        (RuntimeError("DEADLINE_EXCEEDED: Barrier timed out"), 2, True),
        (ValueError(GLOO), 1, False),  # one process: no peer to lose
        (TypeError("UNKNOWN: a bug"), 2, False),
        (ValueError("operands could not be broadcast together"), 2, False),
        (ConfigError("config.train.steps: must be an int"), 2, False),
    ],
)
def test_a_lost_process_is_a_runtime_status_error_of_several_processes(monkeypatch, exc, processes, want):
    monkeypatch.setattr(peers.jax, "process_count", lambda: processes)
    assert peers.lost(exc) is want


def test_the_survivor_says_one_line_naming_the_latest_complete_checkpoint_and_exits_75(tmp_path, monkeypatch, capsys):
    for name in ("3", "6", "9.orbax-checkpoint-tmp"):  # 9: being written when the peer was lost
        (tmp_path / name).mkdir()

    def exit_now(code):
        raise SystemExit(code)

    monkeypatch.setattr(peers.os, "_exit", exit_now)
    with pytest.raises(SystemExit) as stopped:
        peers.exit_requeue(ValueError(GLOO), str(tmp_path), "mhjax train --config c.py --workdir w")
    assert stopped.value.code == EXIT_REQUEUE
    assert capsys.readouterr().err.strip().splitlines() == [
        "mhjax: another process of this run is gone (UNKNOWN: Gloo AllGather failed: [external/gloo/gloo/transport/"
        "tcp/pair.cc:547] Connection closed by peer [127.0.0.1]:8885); exiting with the requeue code; the latest "
        "checkpoint (step 6) holds the run; resume: mhjax train --config c.py --workdir w"
    ]
