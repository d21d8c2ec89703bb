"""One command per workdir: a second train/analyze/report on a busy workdir exits 2 naming the
holder's pid and changes nothing; a lock left by a killed command is taken over."""

import os
import signal
import subprocess
import sys

import pytest

from mhjax.cli import main
from mhjax.config import ConfigError
from mhjax.io.lock import WorkdirLock
from mhjax.io.workdir import Workdir
from tests.conftest import ROOT, config_source, tiny_sequence_config

LOCK = Workdir.LOCK

HOLD = (
    "import sys, time; from mhjax.io.lock import WorkdirLock\nwith WorkdirLock(sys.argv[1], 'train', create=True):\n"
    "    print('locked', flush=True); time.sleep(60)"
)


@pytest.fixture
def holder(tmp_path):
    """A separate process holding the lock of ``tmp_path/W``."""
    workdir = tmp_path / "W"
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(workdir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    yield workdir, process
    process.kill()
    process.wait()


def snapshot(path):
    return {
        p: (os.path.getsize(os.path.join(d, p)), os.stat(os.path.join(d, p)).st_mtime_ns)
        for d, _, files in os.walk(path)
        for p in files
    }


@pytest.mark.parametrize("command", ["train", "analyze", "report"])
def test_a_busy_workdir_refuses_a_second_command_naming_the_holder(holder, tmp_path, capsys, command):
    workdir, process = holder
    config = tmp_path / "tiny.py"
    config.write_text(config_source(tiny_sequence_config()))
    argv = {
        "train": ["train", "--config", str(config), "--workdir", str(workdir), "--no-progress"],
        "analyze": ["analyze", "--workdir", str(workdir)],
        "report": ["report", "--workdir", str(workdir)],
    }[command]
    before = snapshot(workdir)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--workdir" in err and f"pid {process.pid}" in err
    assert snapshot(workdir) == before  # nothing written, not even the lock file


def test_a_lock_left_by_a_killed_command_is_taken_over(holder):
    workdir, process = holder
    with pytest.raises(ConfigError):
        with WorkdirLock(str(workdir), "report"):
            pass
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    with WorkdirLock(str(workdir), "report"):  # the kernel dropped the dead process's lock
        assert os.path.getsize(workdir / LOCK) == 0


def test_report_and_analyze_do_not_create_a_missing_workdir(tmp_path):
    with WorkdirLock(str(tmp_path / "missing"), "report"):
        pass
    assert not (tmp_path / "missing").exists()
    with WorkdirLock(str(tmp_path / "new"), "train", create=True):
        assert (tmp_path / "new" / LOCK).exists()
    with WorkdirLock(str(tmp_path / "new"), "train", create=True):
        pass
