"""A full disk where mhjax writes: a checkpoint or results write failing with ENOSPC is one line
naming the path and exit status 1 (the Python API raises OSError); the previous checkpoint stays
the latest and the same command resumes once space is back. TensorBoard failing to write says so
in the log and never stops the run. The full disk is simulated where the write happens: a
results file whose temporary file is /dev/full, a checkpoint save that raises ENOSPC after
writing part of its files."""

import errno
import json
import os
import subprocess
import sys
import threading

import pytest
from orbax.checkpoint._src.handlers import json_checkpoint_handler

from mhjax import cli
from mhjax.io.curves import read_run
from mhjax.io.tensorboard import MemberWriters
from mhjax.io.workdir import Workdir
from tests.errors_common import ROOT, write_config

FOUR_STEPS = "c.train = ml_collections.ConfigDict(dict(steps=4, chunk_steps=2, eval_every=0, checkpoint_every=2))"

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")


def train(config, workdir):
    return cli.main(["train", "--config", config, "--workdir", str(workdir), "--no-progress"])


def one_line_error(capsys, code):
    err = capsys.readouterr().err
    assert code == 1, err
    lines = [line for line in err.splitlines() if line.startswith("mhjax")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def members(workdir):
    with open(Workdir(workdir).results_path) as f:
        results = json.load(f)
    return [{k: v for k, v in m.items() if k not in ("program_wall_time_s", "wall_time_s")} for m in results["members"]]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    base = tmp_path_factory.mktemp("full")
    config = write_config(base / "four.py", FOUR_STEPS)
    assert train(config, base / "reference") == 0
    return config, members(base / "reference")


def test_results_on_a_full_disk_is_one_line_and_the_same_command_writes_them_later(uninterrupted, tmp_path, capsys):
    config, reference = uninterrupted
    workdir = tmp_path / "w"
    workdir.mkdir()
    os.symlink("/dev/full", workdir / "results.json.tmp")  # every byte written there fails with ENOSPC
    line = one_line_error(capsys, train(config, workdir))
    assert line.startswith(f"mhjax: error: cannot write {workdir / 'results.json'} (No space left on device)")
    assert not (workdir / "results.json").exists() and not os.path.lexists(workdir / "results.json.tmp")
    assert Workdir(workdir).latest_step() == 4  # the final checkpoint was written before the results
    assert train(config, workdir) == 0  # space is back
    assert "not retraining" in capsys.readouterr().err
    assert members(workdir) == reference


def test_a_checkpoint_failing_on_a_full_disk_keeps_the_previous_one(uninterrupted, tmp_path, capsys, monkeypatch):
    config, reference = uninterrupted
    workdir = tmp_path / "w"
    original = json_checkpoint_handler.JsonCheckpointHandler.async_save

    async def full_disk(self, directory, *args, **kwargs):
        """Checkpoint 4's records: half a file written, then the disk is full."""
        if os.path.basename(os.path.dirname(str(directory))).startswith("4."):
            with open(os.path.join(str(directory), "metadata"), "w") as f:
                f.write('{"loss_cur')
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return await original(self, directory, *args, **kwargs)

    monkeypatch.setattr(json_checkpoint_handler.JsonCheckpointHandler, "async_save", full_disk)
    line = one_line_error(capsys, train(config, workdir))
    where = os.path.join(Workdir(workdir).checkpoints_dir, "4")
    assert line == (
        f"mhjax: error: cannot write {where} (No space left on device); checkpoint 2 stays the latest: "
        "free some space and run the same command to resume"
    )
    assert Workdir(workdir).latest_step() == 2 and not (workdir / "results.json").exists()
    monkeypatch.undo()  # space is back
    assert train(config, workdir) == 0
    assert "resuming from checkpoint at step 2" in capsys.readouterr().err
    assert Workdir(workdir).latest_step() == 4 and members(workdir) == reference
    assert not [p for p in os.listdir(Workdir(workdir).checkpoints_dir) if "tmp" in p]


def test_the_python_api_raises_oserror(tmp_path):
    from mhjax.io.results import WriteFailed, write_text

    target = tmp_path / "out.json"
    os.symlink("/dev/full", str(target) + ".tmp")
    with pytest.raises(OSError) as info:
        write_text(str(target), "x" * 100_000)
    assert isinstance(info.value, WriteFailed) and info.value.errno == errno.ENOSPC
    assert str(info.value) == f"cannot write {target} (No space left on device)"


class FullDisk:
    """An event file on a full disk: every write fails with ENOSPC."""

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def flush(self):
        pass

    def close(self):
        pass


def test_tensorboard_on_a_full_disk_says_events_are_lost_and_never_stops_the_run(tmp_path, monkeypatch):
    thread_errors, lines = [], []
    monkeypatch.setattr(threading, "excepthook", thread_errors.append)
    writers = MemberWriters(str(tmp_path), ["full", "fine"], log=lines.append)
    record_file = writers.writers["full"]._get_file_writer().event_writer._ev_writer.events._py_recordio_writer
    record_file._writer.close()
    record_file._writer = FullDisk()  # the disk is full from here on
    for step in range(200):  # far more than tensorboardX's queue of 10: an unemptied queue would block
        for name in ("full", "fine"):
            writers.scalars(name, {"train/loss": 1.0 / (step + 1)}, step)
        if step % 50 == 0:
            writers.flush()
    writers.close()
    assert thread_errors == []
    assert len(lines) == 1 and lines[0].startswith("tensorboard: events of full are lost from here on (OSError")
    assert "No space left on device" in lines[0] and list(writers.lost) == ["full"]
    steps, values = read_run(str(tmp_path / "fine"))["train/loss"]  # the other member's run is whole
    assert list(steps) == list(range(200)) and values[-1] == pytest.approx(1 / 200)


# A real full disk: a small tmpfs that fills during a checkpoint save. Hundreds of tensorstore
# writes are in flight when the first one fails; their callbacks must not reach the terminal.
WIDE = (
    "c.model = ml_collections.ConfigDict(\n"
    "    dict(width=64, num_layers=2, mlp_dim=128, vocab_size=256, seq_len=8, dropout=0.1)\n"
    ")\n"
    "c.sweep.heads = (1, 4)\n"
    "c.train = ml_collections.ConfigDict(dict(steps=6, chunk_steps=2, eval_every=2, checkpoint_every=2))"
)


def _mount_tmpfs(where, size: int) -> bool:
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    return done.returncode == 0


def _train_process(config, workdir):
    command = [sys.executable, "-m", "mhjax", "train", "--config", config, "--workdir", str(workdir), "--no-progress"]
    return subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=600)


# Three training processes of a wider model (a minute on 2 cores): slow. The fast tests above
# fail the checkpoint and results writes with ENOSPC in process and check the same messages.
@pytest.mark.slow
def test_a_real_full_disk_is_one_line_on_the_terminal_and_resumes_once_space_is_back(tmp_path):
    config = write_config(tmp_path / "wide.py", WIDE)
    reference = _train_process(config, tmp_path / "reference")
    assert reference.returncode == 0, reference.stderr
    # Room for everything but half a checkpoint: the reference ends holding two (4 and 6), the
    # failing run has checkpoint 2 when it saves 4. Sizes as allocated (tmpfs counts whole pages).
    allocated = lambda d: sum(f.stat().st_blocks * 512 for f in d.rglob("*") if f.is_file())
    checkpoint = allocated(tmp_path / "reference" / "checkpoints" / "4")
    size = allocated(tmp_path / "reference") - checkpoint // 2
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, size):
        pytest.skip("mounting a tmpfs needs root")
    try:
        failed = _train_process(config, disk / "w")
        assert failed.returncode == 1, failed.stderr
        assert "Traceback" not in failed.stderr and "Event loop is closed" not in failed.stderr, failed.stderr[-3000:]
        errors = [line for line in failed.stderr.splitlines() if line.startswith("mhjax")]
        assert len(errors) == 1 and "(No space left on device); checkpoint 2 stays the latest" in errors[0], errors
        assert len(failed.stderr.splitlines()) <= 4, failed.stderr  # compiling ..., compiled ..., the error
        subprocess.run(["mount", "-o", f"remount,size={64 * 1024 * 1024}", str(disk)], check=True)  # space is back
        resumed = _train_process(config, disk / "w")
        assert resumed.returncode == 0, resumed.stderr
        assert "resuming from checkpoint at step 2" in resumed.stderr
        assert members(disk / "w") == members(tmp_path / "reference")
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)
