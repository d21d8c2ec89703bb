"""What `mhjax train` shows and how it compiles: every program compiled ahead of the loop,
JAX's persistent cache answering a repeated run, Ctrl-C during a compile, the console
(one bar on a terminal, plain lines elsewhere, a results table, the next commands) and
the dry run's labels."""

import io
import json
import os
import pty
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time

import jax
import pytest

from mhjax import cli
from mhjax.experiments import make_experiment
from mhjax.io import compile_cache
from mhjax.train import ahead, engine
from mhjax.train.console import Column, Console, SummaryTable, next_commands, summary_lines, terminal_width
from mhjax.train.loop import run
from mhjax.workflows.train import describe
from tests.conftest import FAST_COMPILE, config_source, tiny_sequence_config, tiny_train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------ compile ahead
def test_chunk_lengths_are_those_the_loop_uses():
    assert ahead.chunk_lengths(0, 7, 3) == [3, 1]
    assert ahead.chunk_lengths(6, 7, 3) == [1]
    assert ahead.chunk_lengths(0, 6, 3) == [3]
    assert ahead.chunk_lengths(3, 9, 3) == [3]
    assert ahead.chunk_lengths(7, 7, 3) == []  # a finished run only evaluates


def test_the_first_chunk_is_cut_at_early_evaluation_steps():
    """Evaluations at k = 1, 2, 5 below a chunk of 10 cut the first chunk there (pieces of 1, 1, 3,
    5 steps: one program of up to 5 steps); steps at or past the first chunk's end cut nothing."""
    plan = ahead.chunk_plan(0, 25, 10, splits=(0, 1, 2, 5, 10, 12))
    assert plan.pieces == [1, 1, 3, 5] and plan.chunks == [10, 5] and plan.piece_length == 5
    assert plan.lengths()[:5] == [(1, True), (1, True), (3, True), (5, True), (10, False)]
    assert ahead.chunk_plan(10, 25, 10, splits=(1, 2, 5)).segments == [(10, False), (5, False)]  # resumed past them
    assert ahead.chunk_plan(0, 4, 10, splits=(2, 6)).segments == [(2, True), (2, True)]
    assert ahead.chunk_plan(0, 25, 10).segments == [(10, False), (10, False), (5, False)]


def test_snapshot_steps_cut_any_chunk_into_pieces_of_one_program():
    """Snapshot steps (``anywhere``) cut whatever chunk holds them, evaluations only the first;
    every piece is run by the one program of the longest piece, and a run resumed inside a cut
    chunk runs the rest of the straight run's pieces."""
    plan = ahead.chunk_plan(0, 25, 10, splits=(1, 13), anywhere=(13, 17, 20, 25))
    assert plan.segments == [(1, True), (9, True), (3, True), (4, True), (3, True), (5, False)]
    assert plan.piece_length == 9 and plan.chunk_lengths == [5]
    assert ahead.chunk_plan(13, 25, 10, anywhere=(13, 17)).segments == [(4, True), (3, True), (5, False)]
    assert ahead.chunk_plan(15, 30, 10, anywhere=(17,)).segments == [(2, True), (3, True), (10, False)]
    assert ahead.chunk_plan(0, 20, 10, anywhere=(0, 10, 20)).segments == [(10, False), (10, False)]  # chunk ends


# ~13 s: a property of the loop no other change touches often
@pytest.mark.slow
def test_the_loop_calls_only_executables_compiled_ahead(tmp_path, monkeypatch):
    """jit functions that refuse to be called (lowering still works): the run must go through
    the compiled executables alone, the last shorter chunk and the resume included."""

    class LowerOnly:
        def __init__(self, jitted):
            self.jitted = jitted

        def lower(self, *args):
            return self.jitted.lower(*args)

        def __call__(self, *args):
            if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves(args)):
                return self.jitted(*args)  # traced (eval_shape), not run
            raise AssertionError("called a jit function inside the loop: not compiled ahead")

    for name in ("make_init", "make_train_chunk", "make_evaluate"):
        original = getattr(engine, name)
        monkeypatch.setattr(engine, name, lambda *a, _f=original, **k: LowerOnly(_f(*a, **k)))
    config = tiny_train(tiny_sequence_config(heads=(1, 2)), 5, 2, 2, 2)
    lines = []
    payload = run(make_experiment(config), str(tmp_path), progress=True, log=lines.append)
    assert payload["steps"] == 5
    assert (
        lines[0] == "compiling 2 programs (2 members): training chunks of 2 and 1 steps, evaluation, initial state ..."
    )
    assert lines[1].startswith("compiled in ")
    # plain progress lines (no terminal here), one per chunk, then the closing line
    assert [line.split(" (")[0] for line in lines if line.startswith("step ")] == ["step 2/5", "step 4/5", "step 5/5"]
    assert lines[-1].startswith("trained 5 steps x 2 members")


# ------------------------------------------------------------------ compile cache
@pytest.fixture
def jax_cache_settings():
    names = ("jax_enable_compilation_cache", "jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs")
    saved = {n: getattr(jax.config, n) for n in names}
    yield
    for n, v in saved.items():
        jax.config.update(n, v)


def test_cache_folder_follows_mhjax_cache_dir_and_the_empty_value_turns_it_off(
    tmp_path, monkeypatch, jax_cache_settings
):
    monkeypatch.delenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", raising=False)
    monkeypatch.setenv("MHJAX_CACHE_DIR", str(tmp_path))
    assert compile_cache.configure() == str(tmp_path / "xla")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla") and jax.config.jax_enable_compilation_cache
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0  # small CPU programs are cached too
    monkeypatch.setenv("MHJAX_CACHE_DIR", "")
    assert compile_cache.configure() is None and not jax.config.jax_enable_compilation_cache
    monkeypatch.delenv("MHJAX_CACHE_DIR")
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    assert compile_cache.configure() == str(tmp_path / "home-cache" / "mhjax" / "xla")  # the default, ~/.cache


def _env(**extra):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for name in ("XLA_FLAGS", "JAX_COMPILATION_CACHE_DIR", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"):
        env.pop(name, None)
    env["XLA_FLAGS"] = FAST_COMPILE  # no forced device count
    env.update(extra)
    return env


def _files(folder):
    return {os.path.join(d, f) for d, _, names in os.walk(folder) for f in names}


@pytest.mark.slow  # ~55 s loaded: two full runs; test_reliability's resumes load from the cache too
def test_a_repeated_run_loads_every_program_from_the_compile_cache(tmp_path):
    """Two processes, one config, MHJAX_CACHE_DIR pointing at a fresh folder: the first run
    fills it, the second compiles nothing (every executable loaded, no new entry)."""
    config = tmp_path / "tiny.py"
    config.write_text(config_source(tiny_train(tiny_sequence_config(heads=(2,)), 4, 2, 2, 2)))
    cache = tmp_path / "cache"
    outputs = []
    for name in ("first", "second"):
        workdir = tmp_path / name
        proc = subprocess.run(
            [sys.executable, "-m", "mhjax", "train", "--config", str(config), "--workdir", str(workdir)],
            env=_env(MHJAX_CACHE_DIR=str(cache)),
            capture_output=True,
            text=True,
            timeout=600,
            cwd=ROOT,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs.append((proc, _files(cache / "xla")))
    (first, after_first), (second, after_second) = outputs
    assert after_first and after_second == after_first
    assert "compiling 1 program (1 member): training chunks of 2 steps, evaluation, initial state" in first.stderr
    assert "3 of 3 loaded from the compile cache" in second.stderr
    # the end of the console: the results table (task x heads) and the next commands
    result = json.load(open(tmp_path / "second" / "results.json"))["members"][0]
    out = second.stdout
    assert "task  heads  members  train loss  held-out loss  held-out accuracy" in out
    row = f"copy  2            1  {result['train_loss']:10.4f}  {result['eval_loss']:13.4f}"
    assert row in out and f"{100 * result['eval_accuracy']:.2f}%" in out
    workdir = tmp_path / "second"
    for command in (f"mhjax analyze --workdir {workdir}", f"mhjax report --workdir {workdir}"):
        assert command in out
    assert f"tensorboard --logdir {workdir}/tb" in out and os.path.isdir(workdir / "tb")


# ------------------------------------------------------------------ Ctrl-C during a compile
# Runs the real CLI with XLA's compile held until a release file appears (the compile thread
# waits; the main thread must still take signals).
DRIVER = """
import os, sys, time
import jax

original_compile = jax.stages.Lowered.compile
HOLD, RELEASE = os.environ["MHJAX_TEST_HOLD"], os.environ["MHJAX_TEST_RELEASE"]


def compile(self, *args, **kwargs):
    open(HOLD, "w").close()
    while not os.path.exists(RELEASE):
        time.sleep(0.05)
    return original_compile(self, *args, **kwargs)


jax.stages.Lowered.compile = compile
from mhjax.cli import main

sys.exit(main(sys.argv[1:]))
"""


def _read_until(proc, text, timeout=120):
    buf, deadline = "", time.monotonic() + timeout
    while time.monotonic() < deadline and text not in buf:
        ready, _, _ = select.select([proc.stderr], [], [], 0.2)
        if ready:
            chunk = os.read(proc.stderr.fileno(), 4096).decode(errors="replace")
            if not chunk:
                break
            buf += chunk
    assert text in buf, f"no {text!r} in stderr:\n{buf[-3000:]}"
    return buf


def _steps(workdir):
    return sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())


@pytest.mark.slow  # ~22 s: test_cli covers Ctrl-C
def test_ctrl_c_during_a_compile_stops_before_training_and_a_second_exits_at_once(tmp_path):
    config = tmp_path / "tiny.py"
    config.write_text(config_source(tiny_train(tiny_sequence_config(heads=(2,)), 6, 3, 3, 3)))
    workdir = tmp_path / "w"
    args = ["train", "--config", str(config), "--workdir", str(workdir), "--no-progress"]
    assert cli.main(args) == 0
    shutil.rmtree(workdir / "checkpoints" / "6")  # as if stopped after checkpoint 3
    os.remove(workdir / "results.json")
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    for presses in (1, 2):
        hold, release = tmp_path / f"hold{presses}", tmp_path / f"release{presses}"
        env = _env(MHJAX_TEST_HOLD=str(hold), MHJAX_TEST_RELEASE=str(release))
        env.update({k: v for k, v in os.environ.items() if k.startswith("JAX_")})  # the tests' shared cache
        proc = subprocess.Popen(
            [sys.executable, str(driver), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT
        )
        try:
            _read_until(proc, "compiling 1 program")
            deadline = time.monotonic() + 120
            while not hold.exists() and time.monotonic() < deadline:  # XLA's compile is under way
                time.sleep(0.05)
            proc.send_signal(signal.SIGINT)
            _read_until(proc, "stopping once a checkpoint can be written")
            if presses == 1:
                release.touch()  # the compile finishes: the run stops before training, nothing to save
                _, err = proc.communicate(timeout=300)
                assert "interrupted at step 3 before training" in err.decode()
            else:
                proc.send_signal(signal.SIGINT)  # the compile is still held: only an immediate exit ends it
                _, err = proc.communicate(timeout=30)
                assert "exiting now" in err.decode()
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 130 and "Traceback" not in err.decode()
        assert _steps(workdir) == [3] and not [d for d in os.listdir(workdir / "checkpoints") if "tmp" in d]


# ------------------------------------------------------------------ console
def test_summary_table_means_over_seeds_without_diverged_members():
    table = SummaryTable(("task", "heads"), (Column("loss", "loss"), Column("acc", "acc", percent=True)))
    records = [
        {"task": "copy", "heads": 1, "seed": 0, "loss": 1.0, "acc": 0.5, "status": "ok"},
        {"task": "copy", "heads": 1, "seed": 1, "loss": 3.0, "acc": 0.25, "status": "ok"},
        {"task": "copy", "heads": 4, "seed": 0, "loss": 2.0, "acc": 0.75, "status": "ok"},
        {"task": "copy", "heads": 4, "seed": 1, "loss": float("nan"), "acc": 0.0, "status": "diverged"},
    ]
    lines = summary_lines(table, records)
    assert lines[0].split() == ["task", "heads", "members", "loss", "acc"]
    assert [line.split() for line in lines[1:]] == [
        ["copy", "1", "2", "2.0000", "37.50%"],
        ["copy", "4", "1", "(+1", "diverged)", "2.0000", "75.00%"],
    ]
    # a row whose members all diverged shows no mean from them
    only_bad = summary_lines(table, records[3:])
    assert only_bad[1].split() == ["copy", "4", "0", "(+1", "diverged)", "-", "-"]
    assert summary_lines(None, records) == []


def test_numbers_below_1e_3_print_in_scientific_notation_in_every_table():
    from mhjax.io.results import markdown_table, number_text
    from mhjax.plotting.report import mean_sd, summary_table

    assert [number_text(v, "{:.4f}") for v in (1e-5, -2.5e-4, 0.0, 0.0123, None)] == [
        "1.00e-05",
        "-2.50e-04",
        "0.0000",
        "0.0123",
        "-",
    ]
    table = SummaryTable(
        ("task", "task_params", "heads"), (Column("loss", "train_loss"), Column("acc", "acc", percent=True))
    )
    records = [
        {"task": "count", "task_params": {"cap": 2}, "heads": 1, "seed": s, "train_loss": 1e-5 * (s + 1), "acc": 1.0}
        for s in (0, 1)
    ] + [{"task": "count", "task_params": {"cap": 4}, "heads": 1, "seed": 0, "train_loss": 0.5, "acc": 1.0}]
    assert [line.split() for line in summary_lines(table, records)[1:]] == [
        ["count", "cap=2", "1", "2", "1.50e-05", "100.00%"],
        ["count", "cap=4", "1", "1", "0.5000", "100.00%"],
    ]
    assert "| count | cap=2 | 1 | 0 | 1.00e-05 |" in markdown_table(
        records, "t", ["task", "task_params", "heads", "seed", "train_loss"]
    )
    assert mean_sd([1e-5, 3e-5], "{:.4f}") == "2.00e-05 ± 1.00e-05"
    assert "| count | cap=2 | 1 | 2 | 1.50e-05 ± 5.00e-06 |" in summary_table(records, ["task", "task_params", "heads"])


def test_next_commands_name_the_workdir_and_analyze_only_where_it_applies():
    assert next_commands("runs/q", "runs/q/tb", analyzable=True) == [
        "mhjax analyze --workdir runs/q",
        "mhjax report --workdir runs/q",
        "tensorboard --logdir runs/q/tb",
    ]
    assert next_commands("my runs/q", "my runs/q/tb", analyzable=False) == [
        "mhjax report --workdir 'my runs/q'",
        "tensorboard --logdir 'my runs/q/tb'",
    ]


def test_mixture_rows_are_n_by_heads():
    from tests.test_mixture_sweep import tiny_mixture_config

    table = make_experiment(tiny_mixture_config()).summary_table()
    assert table.fields[:2] == ("num_train", "heads")
    assert [c.key for c in table.columns] == ["train_loss_eval", "train_accuracy", "test_loss", "test_accuracy"]


def _terminal(rows=24, columns=100):
    import fcntl

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    return master, open(slave, "w", buffering=1)


def _drain(master):
    out = b""
    while select.select([master], [], [], 0.1)[0]:
        out += os.read(master, 65536)
    return out.decode(errors="replace")


def test_on_a_terminal_one_bar_then_the_closing_line_on_its_own(tmp_path, monkeypatch):
    master, terminal = _terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    config = tiny_train(tiny_sequence_config(heads=(2,)), 4, 2, 2, 2)
    for _ in range(2):  # the second run finds training complete: no bar at all
        run(make_experiment(config), str(tmp_path), log=lambda m: print(m, file=sys.stderr))
    terminal.flush()
    text = _drain(master)
    first, second = text.split("training already complete")
    lines = first.replace("\r\n", "\n").split("\n")
    trained = [i for i, line in enumerate(lines) if "trained 4 steps" in line]
    assert len(trained) == 1 and lines[trained[0]].startswith("trained 4 steps")  # not glued to the bar
    assert "4/4" in "".join(lines[: trained[0]]) and "%|" not in "".join(lines[trained[0] :])  # no second bar
    assert "%|" not in second
    os.close(master)


def test_a_terminal_without_a_size_gets_plain_lines():
    for rows, columns, width in ((24, 100, 100), (0, 100, 0), (24, 0, 0)):
        master, terminal = _terminal(rows, columns)
        assert terminal_width(terminal) == width
        terminal.close()
        os.close(master)
    assert terminal_width(io.StringIO()) == 0


def test_without_a_terminal_progress_is_one_plain_line_per_chunk():
    lines, stream = [], io.StringIO()
    console = Console(lines.append, progress=True, stream=stream)
    console.start(total=6, initial=2)
    console.advance(2, 4, 10.0, 1.0)
    console.advance(2, 6, 12.0, 2.0)
    console.close()
    assert lines == ["step 4/6 (67%): 10 member-steps/s, 1 s", "step 6/6 (100%): 12 member-steps/s, 2 s"]
    assert stream.getvalue() == ""
    quiet = []
    console = Console(quiet.append, progress=False, stream=stream)
    console.start(total=6, initial=0)
    console.advance(6, 6, 1.0, 1.0)
    assert quiet == []


# ------------------------------------------------------------------ dry run
def test_dry_run_labels_a_prediction_for_an_accelerator_as_such():
    experiment = make_experiment(tiny_sequence_config(heads=(1, 2, 4)))
    text = describe(experiment, "cpu")
    assert "this machine: cpu, " in text
    assert "estimate for this machine (cpu): none" in text
    assert "accelerator prediction, not this machine: on one NVIDIA H200 SXM this sweep would run grouped" in text
    text = describe(experiment, "gpu")
    assert "estimate for this machine (1 x gpu, priced as 1 x NVIDIA H200 SXM)" in text
    assert "accelerator prediction" not in text
