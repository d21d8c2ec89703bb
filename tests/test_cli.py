"""Command-line ergonomics: --help with defaults, `configs`, `--dry-run`, default workdirs, Ctrl-C and resume."""

import argparse
import glob
import os
import re
import select
import signal
import subprocess
import sys
import time

import pytest

from mhjax import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY_CONFIG = '''"""A tiny sweep for the command-line tests."""
import ml_collections


def get_config():
    c = ml_collections.ConfigDict()
    c.experiment = "sequence"
    c.seed = 0
    c.strategy = "grouped"
    c.sweep = ml_collections.ConfigDict(dict(task=("copy",), heads={heads}, seed=(0,), learning_rate=(3e-3,)))
    c.model = ml_collections.ConfigDict(dict(width=16, num_layers=1, mlp_dim=32, vocab_size=16, seq_len=8, dropout=0.1))
    c.data = ml_collections.ConfigDict(dict(protocol="fixed", num_train=16, batch_size=4, num_eval=8))
    c.train = ml_collections.ConfigDict(
        dict(steps={steps}, chunk_steps={chunk}, eval_every={every}, checkpoint_every={every})
    )
    return c
'''


def _write_config(path, heads=(1, 4), steps=6, chunk=3, every=3):
    path.write_text(TINY_CONFIG.format(heads=tuple(heads), steps=steps, chunk=chunk, every=every))
    return str(path)


def _subparsers():
    parser = cli._parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return parser, action.choices


def _help(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(argv + ["--help"])
    assert exc.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def test_top_level_help_lists_the_commands_in_the_order_of_use_with_a_description(capsys):
    text = _help([], capsys)
    _, commands = _subparsers()
    assert (
        list(commands)
        == list(cli.COMMANDS)
        == ["train", "status", "analyze", "sample", "report", "configs", "example2"]
    )
    listed = text[text.index("train ", text.index("commands")) :]
    positions = [re.search(rf"\b{name} ", listed).start() for name in cli.COMMANDS]
    assert positions == sorted(positions), listed
    for k, name in enumerate(cli.COMMANDS):  # a description of more than two words after each name
        following = listed[positions[k] + len(name) : positions[k + 1] if k + 1 < len(positions) else None]
        assert len(following.split()) > 3, (name, following)


def _option_help(text, options, k):
    """The help text of option ``options[k]`` in a subcommand's --help (whitespace collapsed)."""
    flag = max(options[k].option_strings, key=len)
    start = text.find(flag + " ", text.find("options:"))  # in the option list, not the usage line
    start = start if start >= 0 else text.index(flag, text.find("options:"))
    nxt = [text.find(max(o.option_strings, key=len), start + len(flag)) for o in options[k + 1 :]]
    return text[start : min([i for i in nxt if i > start] or [len(text)])]


def test_every_subcommand_help_shows_what_matters_about_each_option(capsys):
    """A default shown once where there is one, "(required)" on required options, never "(default: None)"."""
    _, commands = _subparsers()
    for name, parser in commands.items():
        text = _help([name], capsys)
        assert "(default: None)" not in text and "(default: False)" not in text, name
        assert parser.description and len(parser.description.split()) > 5, f"mhjax {name} --help has no description"
        options = [a for a in parser._actions if a.option_strings and a.dest != "help"]
        for k, action in enumerate(options):
            flag, part = max(action.option_strings, key=len), _option_help(text, options, k)
            assert part.count("default") <= 1, f"mhjax {name} --help: {flag} tells its default twice: {part}"
            if action.required:
                assert "(required)" in part, f"mhjax {name} --help: {flag} is not marked required"
            elif action.default not in (None, False):
                assert f"(default: {action.default})" in part, f"mhjax {name} --help: {flag} shows no default"
    train = _help(["train"], capsys)
    assert "(default: runs/<config>-<timestamp>)" in train and "--config FILE an ml_collections" in train


@pytest.mark.parametrize(
    "argv, message",
    [
        (["trian"], "argument COMMAND: invalid choice: 'trian'"),
        (["train"], "train: the following arguments are required: --config"),
        (["report"], "report: the following arguments are required: --workdir"),
        (["example2", "--out"], "example2: argument --out: expected one argument"),
    ],
)
def test_argument_errors_have_one_prefix(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.splitlines() == [err.strip()] and err.startswith(f"mhjax: error: {message}"), err
    assert err.count("mhjax") == 1, err


def test_configs_lists_bundled_configs_with_descriptions_in_aligned_columns(capsys):
    assert cli.main(["configs"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    names = {os.path.basename(line.split()[0]) for line in lines}
    assert {"quick.py", "paper.py"} <= names
    assert len(lines) == len(glob.glob(os.path.join(ROOT, "configs", "*.py")))
    column = {re.match(r"\S+\s+", line).end() for line in lines}
    assert len(column) == 1, lines  # every description starts in the same column
    for line in lines:
        path, _, description = line.strip().partition(" ")
        assert path.endswith(".py") and len(description.strip()) > 10, line
        assert "Spec" not in description and "§" not in description, line  # the papers' words
    paper = next(line for line in lines if line.split()[0].endswith("/paper.py"))
    assert "Section 4 of 'Beyond Parallelism' (arXiv 2507.02944) in full" in paper


def test_dry_run_prints_members_and_compiles_nothing(tmp_path, capsys, monkeypatch):
    import jax

    # Importing defines jitted functions (defining is not compiling): import what the command loads first.
    import mhjax.commands.train  # noqa: F401
    import mhjax.experiments.mixture  # noqa: F401
    import mhjax.experiments.sequence  # noqa: F401
    from mhjax.train import engine, loop

    def forbidden(*args, **kwargs):
        raise AssertionError("--dry-run must not compile or train")

    for module, name in ((jax, "jit"), (engine, "make_train_chunk"), (loop, "run")):
        monkeypatch.setattr(module, name, forbidden)
    config = _write_config(tmp_path / "tiny.py", heads=(1, 2, 4))
    workdir = tmp_path / "w"
    start = time.perf_counter()
    assert cli.main(["train", "--config", config, "--workdir", str(workdir), "--dry-run"]) == 0
    assert time.perf_counter() - start < 60
    out = capsys.readouterr().out
    for member in ("copy-h1-s0", "copy-h2-s0", "copy-h4-s0"):
        assert re.search(rf"^{member}\s+[\d,]+\s+\d+\.\d+\s+\d+\.\d+ MiB$", out, re.M), out
    assert "GFLOP/step" in out and "est. memory" in out and "3 members" in out
    assert re.search(r"^strategy: (auto \((fused|unrolled) on \w+\)|\w+) -> \d+ program", out, re.M), out
    assert re.search(r"^attention: (jax|cpu_kernel) \(config.attention=auto on cpu\)(; .+)?$", out, re.M), out
    assert re.search(r"^this machine: \w+, \d+ devices? ", out, re.M), out
    assert not workdir.exists()


def _read_until(proc, pattern, timeout):
    """Read the child's stderr until ``pattern`` matches (tqdm redraws with \\r); returns the text so far."""
    buf, deadline = b"", time.time() + timeout
    fd = proc.stderr.fileno()
    while time.time() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
            if re.search(pattern, buf.decode(errors="replace")):
                return buf.decode(errors="replace")
        elif proc.poll() is not None:
            break
    raise AssertionError(f"no {pattern!r} within {timeout}s; stderr so far:\n{buf.decode(errors='replace')[-3000:]}")


def test_ctrl_c_checkpoints_exits_130_and_the_next_run_resumes(tmp_path):
    steps = 150
    config = _write_config(tmp_path / "tiny.py", heads=(2,), steps=steps, chunk=1, every=0)
    command = [sys.executable, "-m", "mhjax", "train", "--config", config]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _read_until(proc, rf"\b([1-9]\d*)/{steps}\b", timeout=300)  # the first chunk has run
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = err.decode()
    assert proc.returncode == 130, err[-3000:]
    assert "checkpoint written" in err and "Traceback" not in err
    # the default workdir: runs/<config name>-<timestamp>
    workdirs = glob.glob(str(tmp_path / "runs" / "tiny-*"))
    assert len(workdirs) == 1 and re.fullmatch(r"tiny-\d{8}-\d{6}", os.path.basename(workdirs[0]))
    workdir = workdirs[0]
    saved = [int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()]
    assert saved and 0 < max(saved) < steps
    assert not os.path.exists(os.path.join(workdir, "results.json"))

    done = subprocess.run(
        command[:-2] + ["--config", config, "--workdir", workdir, "--no-progress"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from checkpoint at step {max(saved)}" in done.stderr
    assert os.path.isfile(os.path.join(workdir, "results.json"))
    assert max(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()) == steps


# ~30 s: a real run stopped and resumed; test_resume_records stops the loop on SIGTERM in process
@pytest.mark.slow
def test_sigterm_checkpoints_exits_75_with_the_resume_command_that_resumes(tmp_path):
    steps = 150
    config = _write_config(tmp_path / "tiny.py", heads=(2,), steps=steps, chunk=1, every=0)
    workdir = str(tmp_path / "w")
    command = [sys.executable, "-m", "mhjax", "train", "--config", config, "--workdir", workdir]
    proc = subprocess.Popen(command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        _read_until(proc, rf"\b([1-9]\d*)/{steps}\b", timeout=300)  # the first chunk has run
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    err = err.decode()
    assert proc.returncode == 75, err[-3000:]
    stop = re.search(r"mhjax: SIGTERM: stopped at step (\d+), checkpoint written; resume: (mhjax train .*)$", err, re.M)
    assert stop and "Traceback" not in err, err[-3000:]
    assert max(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit()) == int(stop[1])
    resume = stop[2].split()  # mhjax train --config ... --workdir W, run as python -m mhjax
    done = subprocess.run(
        [sys.executable, "-m", "mhjax", *resume[1:], "--no-progress"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"resuming from checkpoint at step {stop[1]}" in done.stderr
