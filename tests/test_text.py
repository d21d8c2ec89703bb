"""The text task (mhjax/data/text.py): files read as bytes or uint16 .bin, the held-out split,
windows from the member's data key (paired members draw the same), bad files as one line,
the file recorded and a changed one refused, and a tiny model on Python's own documentation
beating the unigram entropy of its held-out bytes, then analysed and run forward."""

import contextlib
import io
import json
import math
import os
import shutil
import sys

import jax
import numpy as np
import pytest
from scipy import stats

import mhjax
from mhjax import cli
from mhjax.analysis.metrics import task_sequences
from mhjax.config import ConfigError
from mhjax.data import heldout_split, sequences, text
from mhjax.experiments import make_experiment
from mhjax.train import loop
from tests.conftest import config_source, set_field, tiny_sequence_config, tiny_train
from tests.errors_common import ROOT, assert_one_line_error

sys.path.insert(0, os.path.join(ROOT, "examples"))
from python_docs import python_docs  # noqa: E402


def text_config(path, seq_len=8, vocab_size=256, **sweep):
    config = tiny_sequence_config(task=("text",), **sweep)
    with config.unlocked():
        config.model.seq_len = seq_len
        config.model.vocab_size = vocab_size
        config.data.path = str(path)
        config.data.protocol = "fresh"
    return config


def write(path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def test_byte_file_splits_at_the_holdout_and_windows_shift_by_one(tmp_path):
    # training bytes below 128, held-out bytes from 128 on: every window shows where it came from
    rng = np.random.default_rng(0)
    data = np.concatenate([rng.integers(0, 128, 900), rng.integers(128, 256, 100)]).astype(np.uint8)
    config = text_config(write(tmp_path / "c.txt", data.tobytes()), seq_len=16)
    task = text.bind(config)
    corpus = text.load(config.data.path)
    assert corpus.encoding == "bytes" and corpus.train.size == 900 and corpus.heldout.size == 100
    counts = np.bincount(data[900:])
    p = counts[counts > 0] / 100
    assert task.facts["heldout_unigram_entropy_bits"] == pytest.approx(-(p * np.log2(p)).sum())
    key = jax.random.PRNGKey(3)
    for draw, low, high, part in ((task.draw, 0, 128, data[:900]), (task.draw_eval, 128, 256, data[900:])):
        inputs, targets, weights = (np.asarray(a) for a in draw(key, 20, 16, 256))
        assert inputs.shape == (20, 16) and inputs.dtype == np.int32 and (weights == 1).all()
        np.testing.assert_array_equal(inputs[:, 1:], targets[:, :-1])  # targets: the next byte
        assert inputs.min() >= low and targets.max() < high
        text_part = part.tobytes()
        for x, y in zip(inputs, targets):  # each window is a piece of its own part
            assert bytes(np.append(x, y[-1]).astype(np.uint8)) in text_part
    # two members' batches from one data key are equal, from another key different
    a, b = task.draw(key, 4, 16, 256), task.draw(jax.random.PRNGKey(4), 4, 16, 256)
    np.testing.assert_array_equal(a.inputs, task.draw(key, 4, 16, 256).inputs)
    assert not np.array_equal(a.inputs, b.inputs)


def test_bin_file_of_uint16_ids_needs_vocab_above_its_largest_id(tmp_path):
    ids = (np.arange(2000) * 7 % 1000).astype("<u2")
    path = write(tmp_path / "c.bin", ids.tobytes())
    task = text.bind(text_config(path, seq_len=8, vocab_size=1000))
    inputs, targets, _ = task.draw_eval(jax.random.PRNGKey(0), 3, 8, 1000)
    assert task.facts["text_format"] == "uint16" and np.asarray(inputs).max() < 1000
    held = ids[1800:].astype(np.int64)
    start = int(np.flatnonzero(held == int(inputs[0, 0]))[0])
    np.testing.assert_array_equal(np.asarray(inputs[0]), held[start : start + 8])
    with pytest.raises(
        ConfigError,
        match=r"config.model.vocab_size: .* holds token id 999; vocab_size must be above it \(at least 1000\), got 999",
    ):
        text.bind(text_config(path, vocab_size=999))


def test_members_differing_in_heads_and_learning_rate_draw_the_same_windows(tmp_path):
    path = write(tmp_path / "c.txt", bytes(np.random.default_rng(1).integers(0, 256, 3000, dtype=np.uint8)))
    config = text_config(path, heads=(1, 2), learning_rate=(1e-3, 3e-3), seed=(0, 1))
    experiment = make_experiment(config)
    draws = {}
    for member in experiment.members:
        c = experiment.member_constants(member)
        keys = {k: jax.random.fold_in(c.data_key, i) for i, k in enumerate(("dataset", "shuffle", "fresh"))}
        batch = sequences.train_batch(
            keys, c.task_id, 5, protocol="fresh", num_train=16, batch_size=4, length=8, vocab_size=256,
            tasks=experiment.tasks,
        )  # fmt: skip
        held = sequences.eval_batch(c.eval_key, c.task_id, 8, 8, 256, experiment.tasks)
        draws.setdefault(member["seed"], []).append((np.asarray(batch.inputs), np.asarray(held.inputs)))
    for same in draws.values():
        assert len(same) == 4 and all(
            np.array_equal(s[0], same[0][0]) and np.array_equal(s[1], same[0][1]) for s in same
        )
    assert not np.array_equal(draws[0][0][0], draws[1][0][0])  # another seed: other training windows
    np.testing.assert_array_equal(draws[0][0][1], draws[1][0][1])  # but the same held-out windows
    # ... which start where the held-out starts recorded per sweep say: in the test blocks
    c = experiment.member_constants(experiment.members[0])
    size = text.load(path).heldout.size
    starts = np.asarray(heldout_split.part_starts(c.eval_key, 8, size, 8, heldout_split.TEST))
    np.testing.assert_array_equal(draws[0][0][1], text.read_windows(text.load(path).heldout, starts, 8)[:, :-1])


@pytest.mark.parametrize(
    "strategy,groups,pieces",
    [
        ("fused", 1, False),  # members vmapped: one group
        pytest.param("fused", 1, True, marks=pytest.mark.slow),  # the first chunk cut: make_partial_chunk
        pytest.param("unrolled", 4, True, marks=pytest.mark.slow),  # a group per member
        pytest.param("one_program", 1, True, marks=pytest.mark.slow),  # the layout: one gradient of all members
    ],
)
def test_a_file_above_the_on_device_limit_is_read_by_the_host_once_per_chunk_with_equal_results(
    tmp_path, monkeypatch, strategy, groups, pieces
):
    data = bytes(np.random.default_rng(2).integers(0, 64, 4000, dtype=np.uint8))
    config = tiny_train(text_config(write(tmp_path / "c.txt", data), heads=(1, 2), seed=(0, 1)), 6, 3, 3, 6)
    config.strategy = strategy
    if pieces:
        set_field(config, "train.snapshot_steps", (1,))  # the first chunk cut into pieces of 1 and 2 steps
    on_device = mhjax.sweep(config, tmp_path / "device", progress=False)
    monkeypatch.setattr(text, "ON_DEVICE_LIMIT", 1000)
    text._LOADED.clear(), text._BOUND.clear()
    train = text.load(config.data.path).train
    assert isinstance(train, np.memmap)
    reads, runs, read = [], [], text.read_windows

    def counted(ids, starts, length):
        reads.append((ids.size == train.size, np.shape(starts)))
        return read(ids, starts, length)

    def counting(name, method):
        return lambda self, program, *args: runs.append(name) or method(self, program, *args)

    monkeypatch.setattr(text, "read_windows", counted)
    for name in ("run_chunk", "run_piece"):
        monkeypatch.setattr(loop.Sweep, name, counting(name, getattr(loop.Sweep, name)))
    try:
        from_host = mhjax.sweep(config, tmp_path / "host", progress=False)
    finally:
        text._LOADED.clear(), text._BOUND.clear()
    # one read per chunk (or piece: its program's 2 steps) and group of members, each of the
    # whole chunk's windows (members, steps, batch), not one read per step
    training = [shape for is_train, shape in reads if is_train]
    want = ["run_piece", "run_piece", "run_chunk"] if pieces else ["run_chunk", "run_chunk"]
    assert runs == want and len(training) == len(runs) * groups, (runs, reads)
    steps = [2 if run == "run_piece" else 3 for run in runs for _ in range(groups)]
    assert [s[1:] for s in training] == [(n, 4) for n in steps]
    assert sum(s[0] for s in training) == len(runs) * 4
    for a, b in zip(on_device.results, from_host.results):
        for field in ("train_loss", "eval_loss", "eval_accuracy", "eval_bits_per_byte", "heldout_unigram_entropy_bits"):
            assert a[field] == b[field], (a["name"], field)
        for x, y in zip(
            jax.tree_util.tree_leaves(on_device.params(a["name"])),
            jax.tree_util.tree_leaves(from_host.params(a["name"])),
        ):
            np.testing.assert_array_equal(x, y)  # bit for bit


BAD_FILES = [
    ("missing", None, [], "config.data.path: file not found"),
    ("directory", "dir", [], "c.txt is a directory; give a corpus file"),
    ("one-token", b"abcdefghij" * 2, ["--config.data.holdout=0.05"], "(last 0.05) part has 1 token, fewer than"),
    ("empty", b"", [], "is empty"),
    (
        "too-short-heldout",
        b"abcdefghij" * 8,
        [],
        "held-out (last 0.1) part has 8 tokens, fewer than 2 (model.seq_len + 1)",
    ),
    ("too-short-train", b"abcdefghi" * 2, ["--config.data.holdout=0.5"], "training part has 9 tokens"),
    ("odd-bin", b"abc", [], "uint16 token ids, 2 bytes each) of an odd size (3 bytes)"),
    ("id-above-vocab", bytes(range(200)) * 2, ["--config.model.vocab_size=100"], "holds byte 199; vocab_size must"),
    (
        "bin-id-above-vocab",
        np.arange(400, dtype="<u2").tobytes(),
        ["--config.model.vocab_size=399"],
        "holds token id 399; vocab_size must be above it (at least 400), got 399",
    ),
    ("unset", "", [], "config.data.path: the text task reads a corpus file; set it"),
    ("holdout", b"abcdefghij" * 100, ["--config.data.holdout=1.5"], "config.data.holdout: must be a number in (0, 1)"),
]


@pytest.mark.parametrize("data,extra,match", [c[1:] for c in BAD_FILES], ids=[c[0] for c in BAD_FILES])
def test_bad_files_are_one_line_exit_2(tmp_path, capsys, data, extra, match):
    config = tmp_path / "text.py"
    config.write_text(config_source(text_config("x")))
    name = "c.bin" if "odd size" in match or "token id" in match else "c.txt"
    path = "" if data == "" else str(tmp_path / name)
    if isinstance(data, bytes):
        write(tmp_path / name, data)
    elif data == "dir":
        os.mkdir(tmp_path / name)
    argv = ["train", "--config", str(config), f"--config.data.path={path}", *extra, "--workdir", str(tmp_path / "w")]
    assert_one_line_error(capsys, cli.main(argv), match)
    assert not os.path.exists(tmp_path / "w")


def test_a_bin_file_trains_from_the_cli_recorded_in_bits_per_token(tmp_path, capsys):
    # nanoGPT's format: uint16 ids, little-endian, above 255 (model.vocab_size above the largest)
    ids = (np.random.default_rng(3).integers(0, 300, 3000) // 3 * 3).astype("<u2")
    path = write(tmp_path / "train.bin", ids.tobytes())
    config = tmp_path / "text.py"
    config.write_text(config_source(tiny_train(text_config("x", vocab_size=320, heads=(1, 2)), 4, 2, 2, 4)))
    workdir = str(tmp_path / "w")
    argv = ["train", "--config", str(config), f"--config.data.path={path}", "--workdir", workdir]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert "held-out bits/token" in out and "bits/byte" not in out, out
    recorded = json.load(open(os.path.join(workdir, "mhjax.json")))
    sha = __import__("hashlib").sha256(ids.tobytes()).hexdigest()
    want = {"path": path, "size": 6000, "sha256": sha, "format": "uint16"}
    assert recorded["tasks"]["text"]["data"] == recorded["data_files"]["task text"] == want
    held = ids[2700:]
    p = np.bincount(held)[np.bincount(held) > 0] / held.size
    for member in json.load(open(os.path.join(workdir, "results.json")))["members"]:
        assert member["text_format"] == "uint16" and "eval_bits_per_byte" not in member  # bits per byte: bytes only
        assert member["eval_bits_per_token"] == pytest.approx(member["eval_loss"] / math.log(2), rel=1e-4)
        assert member["heldout_unigram_entropy_bits"] == pytest.approx(float(-(p * np.log2(p)).sum()))
    # sampled: token ids in and out, or tokens of a vocabulary file (one a line, line number = id)
    want = mhjax.load(workdir).sample("text-h2-s0", [3, 6, 9], 4, temperature=0).ids.tolist()
    argv = ["sample", "--workdir", workdir, "--member", "text-h2-s0", "--tokens", "4", "--temperature", "0"]
    assert cli.main([*argv, "--prompt", "3,6 9"]) == 0
    assert capsys.readouterr().out.split() == [str(i) for i in [3, 6, 9, *want]]
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(f"w{i}\n" for i in range(300)))  # ids 300-319 past its end: <id>
    assert cli.main([*argv, "--prompt", "w3 w6 9", "--vocab", str(vocab), "--join", "_"]) == 0
    assert capsys.readouterr().out == "_".join(f"w{i}" if i < 300 else f"<{i}>" for i in [3, 6, 9, *want]) + "\n"
    assert_one_line_error(capsys, cli.main([*argv, "--prompt", "w3 x"]), "--prompt: 'w3' is not an id")


# ------------------------- a tiny model on Python's docs -------------------------
@pytest.fixture(scope="module")
def docs_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("text")
    path = write(base / "docs.txt", python_docs(96))
    config = tiny_train(text_config(path, seq_len=32, heads=(1, 2), seed=(0, 1)), 150, 75, 75, 150)
    with config.unlocked():
        config.train.snapshot_steps = (75,)  # a kept step besides the checkpoint (sampling at a step)
        config.model.update(width=32, num_layers=2, mlp_dim=64, dropout=0.0)
        config.data.update(batch_size=16, num_eval=40)  # not a multiple of the batch: taken as given
        config.sweep.learning_rate = (3e-3,)
        config.strategy = "auto"
    console = io.StringIO()
    with contextlib.redirect_stderr(console):
        run = mhjax.sweep(config, base / "w", progress=False)
    run.console = console.getvalue()
    return run, path


def test_a_tiny_model_beats_the_unigram_entropy_of_the_held_out_bytes(docs_run):
    run, path = docs_run
    data = np.frombuffer(open(path, "rb").read(), np.uint8)
    held = data[data.size - int(round(data.size * 0.1)) :]
    p = np.bincount(held)[np.bincount(held) > 0] / held.size
    entropy = float(-(p * np.log2(p)).sum())  # computed here, apart from the task's own
    results = json.load(open(os.path.join(run.workdir, "results.json")))
    for member in results["members"]:
        assert member["heldout_unigram_entropy_bits"] == pytest.approx(entropy)
        assert member["eval_bits_per_byte"] == pytest.approx(member["eval_loss"] / math.log(2), rel=1e-4)
        assert member["eval_bits_per_byte"] < entropy, (member["name"], member["eval_bits_per_byte"], entropy)
    recorded = json.load(open(os.path.join(run.workdir, "mhjax.json")))
    sha = __import__("hashlib").sha256(data.tobytes()).hexdigest()
    assert recorded["tasks"]["text"]["data"] == {"path": path, "size": data.size, "sha256": sha, "format": "bytes"}
    assert all(m["corpus_sha256"] == sha and "corpus_python" not in m for m in results["members"])  # a file: no Python


def test_analysis_and_forward_use_held_out_windows(docs_run):
    run, _ = docs_run
    run.analyze(num_sequences=6, plot=False, tensorboard=False, members="*-s0")
    task = text.bind(run.config)
    batch, source = task_sequences(task, None, 6, 0, 32, 256)  # the analysis's own sequences (seed 0)
    held = np.asarray(text.load(run.config.data.path).heldout).tobytes()
    assert all(bytes(np.asarray(x, np.uint8)) in held for x in batch.inputs)
    for name in ("text-h1-s0", "text-h2-s0"):
        entry = run.analysis["members"][name]
        assert len(entry["layers"]) == 2 and "ablation" in entry["layers"][1]
        out = run.forward(name, batch.inputs, batch.targets, batch.weights)
        assert float(out.loss.mean()) == pytest.approx(entry["loss"], rel=1e-5)


def test_analyze_by_step_scores_each_kept_step_on_the_same_held_out_windows(docs_run, tmp_path, capsys):
    """`mhjax analyze --steps` on a text run: the snapshot (75) and the checkpoint (150), each
    step's entry from that step's parameters on one set of held-out windows, logged to
    TensorBoard at its step (curves over steps)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run, _ = docs_run
    out = str(tmp_path / "a")  # its own folder: the other tests' analysis.json stays as it is
    argv = ["analyze", "--workdir", run.workdir, "--out", out, "--num-sequences", "5", "--no-plot"]
    assert cli.main([*argv, "--steps", "all"]) == 0, capsys.readouterr().err
    assert "steps analysed: 75, 150 (by_step); above: step 150" in capsys.readouterr().out
    data = json.load(open(os.path.join(out, "analysis.json")))
    assert list(data["by_step"]) == ["75", "150"] and data["members"] == data["by_step"]["150"]
    batch, _ = task_sequences(text.bind(run.config), None, 5, 0, 32, 256)  # --seed 0: held-out windows
    held = np.asarray(text.load(run.config.data.path).heldout).tobytes()
    assert all(bytes(np.asarray(x, np.uint8)) in held for x in batch.inputs)
    for name in ("text-h1-s0", "text-h2-s0"):
        losses = [data["by_step"][step][name]["loss"] for step in ("75", "150")]
        for step, loss in zip((75, 150), losses):  # the step's own parameters, computed apart
            out_at = run.forward(name, batch.inputs, batch.targets, batch.weights, step=step)
            assert float(out_at.loss.mean()) == pytest.approx(loss, rel=1e-5), (name, step)
        assert losses[0] != losses[1]
        events = EventAccumulator(os.path.join(run.workdir, "tb", name), size_guidance={"scalars": 0})
        events.Reload()
        assert [e.step for e in events.Scalars("analysis/layer0/mixing_time")] == [75, 150]


def test_a_changed_file_is_refused_on_resume_and_analysis(docs_run, tmp_path, capsys):
    run, path = docs_run
    workdir = str(tmp_path / "w")
    shutil.copytree(run.workdir, workdir)
    original = open(path, "rb").read()
    try:
        with open(path, "wb") as f:
            f.write(original[::-1])  # same size, other bytes
        code = cli.main(["analyze", "--workdir", workdir, "--no-tensorboard"])
        line = assert_one_line_error(capsys, code, "task 'text': its data file")
        assert "changed since training (sha256 differs)" in line and "--allow-changed-task" in line
        copied = mhjax.load(workdir)
        windows = np.arange(64, dtype=np.int32).reshape(2, 32) % 256
        for targets in (None, windows):  # given targets too: the windows came from the file
            with pytest.raises(ConfigError, match=r"its data file .* changed since training .*allow_changed_task=True"):
                copied.forward("text-h1-s0", windows, targets)
        out = copied.forward("text-h1-s0", windows, windows, allow_changed_task=True)
        sha = __import__("hashlib").sha256(original[::-1]).hexdigest()
        assert out.allow_changed_task and out.task_sha256["current"] == sha != out.task_sha256["recorded"]
        config = tmp_path / "c.py"
        config.write_text(config_source(run.config))
        code = cli.main(["train", "--config", str(config), "--workdir", workdir])
        assert_one_line_error(capsys, code, "differs from it now (sha256 differs)")
        code = cli.main(["train", "--config", str(config), "--workdir", workdir, "--allow-changed-task"])
        assert_one_line_error(capsys, code, "differs from it now (sha256 differs)")  # the data: never allowed
    finally:
        with open(path, "wb") as f:
            f.write(original)


# ------------------------- sampling (analysis/sampling.py) -------------------------
def greedy_by_hand(run, member, prompt_ids, tokens, step=None):
    """Greedy decoding through run.forward: each token the argmax at the last position of the
    last seq_len (32) tokens."""
    ids = list(prompt_ids)
    for _ in range(tokens):
        logits = run.forward(member, np.asarray(ids[-32:], np.int32)[None], step=step).logits
        ids.append(int(np.argmax(logits[0, -1])))
    return ids[len(prompt_ids) :]


def test_greedy_sampling_continues_a_prompt_as_a_greedy_decode_by_hand(docs_run):
    from mhjax.analysis import sampling

    run, path = docs_run
    held = open(path, "rb").read()[-5000:]
    prompt = held[100:130].decode("utf-8", errors="ignore")  # 30 bytes: the window fills, then shifts
    assert 28 <= len(prompt.encode()) <= 30
    before = sampling.step_fn.cache_info().currsize
    for member in ("text-h1-s0", "text-h2-s0"):
        out = run.sample(member, prompt, 6, temperature=0)
        want = greedy_by_hand(run, member, list(prompt.encode()), 6)
        assert out.ids.tolist() == want and out.step == 150 and out.context == 32
        assert out.text == bytes(list(prompt.encode()) + want).decode("utf-8", errors="replace")
        assert out.continuation == bytes(want).decode("utf-8", errors="replace")
    long = held[200:260].decode("utf-8", errors="ignore")  # longer than T = 32: the last 32 bytes count
    out = run.sample("text-h1-s0", long, 5, temperature=0)
    assert out.ids.tolist() == greedy_by_hand(run, "text-h1-s0", list(long.encode()), 5)
    assert out.ids.tolist() == run.sample("text-h1-s0", long.encode()[-32:].decode(errors="ignore"), 5, 0).ids.tolist()
    # one compiled step per model (h1, h2), for every prompt length and token count
    assert sampling.step_fn.cache_info().currsize - before == 2
    assert all(sampling.step_fn(256, 32, 32, 2, 64, h, None)._cache_size() == 1 for h in (1, 2))
    # at a snapshot as at the checkpoint; a step not kept is one line
    at75 = run.sample("text-h1-s0", prompt, 6, temperature=0, step=75)
    assert at75.step == 75 and at75.ids.tolist() == greedy_by_hand(run, "text-h1-s0", list(prompt.encode()), 6, 75)
    with pytest.raises(ConfigError, match=r"^step: no checkpoint or snapshot at step 74 .*\(kept: 75, 150\)$"):
        run.sample("text-h1-s0", prompt, 6, step=74)


def test_sampling_is_deterministic_by_seed_and_top_k_keeps_the_k_most_likely(docs_run):
    run, path = docs_run
    prompt = open(path, "rb").read()[-3000:-2960].decode("utf-8", errors="ignore")  # >= 32 bytes: full windows
    member = "text-h2-s0"
    draws = {
        (seed, k): run.sample(member, prompt, 24, temperature=2.0, top_k=k, seed=seed).ids
        for seed, k in ((3, None), (4, None), (3, 3))
    }
    np.testing.assert_array_equal(draws[3, None], run.sample(member, prompt, 24, temperature=2.0, seed=3).ids)
    assert not np.array_equal(draws[3, None], draws[4, None])
    greedy = run.sample(member, prompt, 24, temperature=0).ids
    np.testing.assert_array_equal(run.sample(member, prompt, 24, temperature=2.0, top_k=1, seed=5).ids, greedy)

    def ranks(ids):  # each drawn token's rank among the logits of its own context (0: the most likely)
        seq = list(prompt.encode()) + ids.tolist()
        start = len(seq) - len(ids)
        contexts = np.asarray([seq[i - 32 : i] for i in range(start, len(seq))], np.int32)
        logits = run.forward(member, contexts).logits[:, -1]
        return [int((row > row[t]).sum()) for row, t in zip(logits, ids)]

    assert max(ranks(draws[3, 3])) < 3  # top-k 3: only the three most likely
    assert max(ranks(draws[3, None])) >= 3  # without it, at temperature 2, others come too


def test_sample_from_the_command_line_prints_the_text_and_refuses_bad_input_in_one_line(docs_run, capsys):
    run, path = docs_run
    argv = ["sample", "--workdir", run.workdir, "--member", "text-h1-s0", "--prompt", "def ", "--tokens", "10"]
    assert cli.main([*argv, "--temperature", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.out == run.sample("text-h1-s0", "def ", 10, temperature=0).text + "\n"
    assert "at step 150: 10 tokens at temperature 0" in captured.err and "the last 32 tokens" in captured.err
    for extra, match in (
        (["--temperature", "-1"], "--temperature: must be a finite number >= 0 (0: greedy), got -1.0"),
        (["--top-k", "-2"], "--top-k: must be a positive integer"),
        (["--step", "3"], "step: no checkpoint or snapshot at step 3"),
        (["--vocab", path], "--vocab: this member reads bytes"),
    ):
        assert_one_line_error(capsys, cli.main([*argv, *extra]), match)
    code = cli.main(["sample", "--workdir", run.workdir, "--member", "text-h1-s0", "--prompt", "", "--tokens", "3"])
    assert_one_line_error(capsys, code, "--prompt: give at least one token")


def test_prompts_encode_and_samples_decode_as_the_member_reads_tokens():
    from mhjax.workflows.sample import decode, encode

    assert encode("hé", True, None).tolist() == [104, 195, 169]  # a byte file's members: UTF-8 bytes
    assert decode([104, 195, 169, 0xFF, 300], True, None) == "hé\ufffd\ufffd"  # invalid or above 255: U+FFFD
    vocab = ["a", "b c", "a"]  # line number = id; a repeated token reads as its first line
    assert encode("12 7,301", False, None).tolist() == [12, 7, 301]
    assert encode("a 2", False, vocab).tolist() == [0, 2]
    assert decode([1, 0, 5], False, vocab, "|") == "b c|a|<5>" and decode([1], False, None) is None
    with pytest.raises(ConfigError, match=r"^--prompt: 'b' is neither an id nor a line of --vocab$"):
        encode("a b", False, vocab)


# ------------------- issue 48: paired windows, baselines, LM curves -------------------
def window_sums(run, name):
    """A member's per-window sums as the workdir keeps them (io/window_files.py)."""
    return np.load(os.path.join(run.workdir, "eval_windows", f"{name}.npy"))


def clustered_se(per_window, clusters):
    """The SE of a mean of equal-weight windows, clustered: by hand (analysis/paired.py's rule)."""
    ids = np.unique(clusters)
    resid = np.array([(per_window[clusters == g] - per_window.mean()).sum() for g in ids])
    return math.sqrt(ids.size / (ids.size - 1) * (resid**2).sum()) / per_window.size


def test_every_seed_is_scored_on_the_recorded_windows_with_its_standard_error(docs_run):
    run, path = docs_run
    results = json.load(open(os.path.join(run.workdir, "results.json")))
    held = text.load(path).heldout
    folder = os.path.join(run.workdir, "eval_windows")
    starts = np.load(os.path.join(folder, "text.starts.npy"))
    val_starts = np.load(os.path.join(folder, "text.validation.starts.npy"))
    assert starts.size == 40 and results["baselines"]["text"]["windows"] == 40  # num_eval, not cut to 32
    # the validation and test windows never share a token: their blocks alternate (data/heldout_split.py)
    block = results["baselines"]["text"]["block_length"]
    assert set(starts // block % 2) == {1} and set(val_starts // block % 2) == {0}
    assert ((starts % block) + 33 <= block).all() and ((val_starts % block) + 33 <= block).all()
    tokens = lambda s: set((s[:, None] + np.arange(33)).ravel())  # noqa: E731
    assert not tokens(starts) & tokens(val_starts)
    clusters = np.load(os.path.join(folder, "text.clusters.npy"))
    np.testing.assert_array_equal(clusters, starts // block)  # a plain file: blocks are the clusters
    assert results["baselines"]["text"]["clusters"] == np.unique(clusters).size
    assert {m["eval_set"] for m in results["members"]} == {results["members"][0]["eval_set"]}  # one set for all
    assert {m["val_set"] for m in results["members"]} == {results["members"][0]["val_set"]} != {starts.size}
    for which, at, prefix in (("test", starts, "eval"), ("validation", val_starts, "val")):
        windows = text.read_windows(held, at, 32)
        cl = np.load(os.path.join(folder, "text" + ("" if which == "test" else ".validation") + ".clusters.npy"))
        for member in results["members"]:
            # per-window losses here, through run.forward on the recorded windows, against the stored ones
            out = run.forward(member["name"], windows[:, :-1], windows[:, 1:])
            per_window = np.asarray(out.loss, np.float64).reshape(40, 32).mean(axis=1)
            sums = window_sums(run, member["name"] + ("" if which == "test" else ".validation"))
            np.testing.assert_allclose(sums[0] / sums[1], per_window, rtol=2e-5)
            assert member[f"{prefix}_loss"] == pytest.approx(per_window.mean(), rel=1e-5)
            assert member[f"{prefix}_loss_se"] == pytest.approx(clustered_se(per_window, cl), rel=1e-4)
            se = member[f"{prefix}_bits_per_byte_se"]
            assert se == pytest.approx(member[f"{prefix}_loss_se"] / math.log(2))


def test_the_report_pairs_head_counts_over_windows_and_seeds(docs_run):
    run, _ = docs_run
    report = open(run.report()["md"]).read()
    assert "## Head counts against the smallest, paired on the same held-out windows" in report
    results = json.load(open(os.path.join(run.workdir, "results.json")))
    sums = {(m["heads"], m["seed"]): window_sums(run, m["name"]) for m in results["members"]}
    clusters = np.load(os.path.join(run.workdir, "eval_windows", "text.clusters.npy"))
    loss = {k: s[0] / s[1] for k, s in sums.items()}
    # the rule written out here: per-seed differences d_s, t(1) on their spread, plus the clustered SE
    # of the per-window differences averaged over the seeds (shared windows), in bits
    delta = np.stack([loss[2, s] - loss[1, s] for s in (0, 1)])
    d = delta.mean(axis=1)
    se = math.sqrt(d.var(ddof=1) / 2 + clustered_se(delta.mean(axis=0), clusters) ** 2)
    half = stats.t.ppf(0.975, 1) * se
    low, high = (d.mean() - half) / math.log(2), (d.mean() + half) / math.log(2)
    verdict = "within noise" if low <= 0 <= high else ("lower" if high < 0 else "higher")
    row = f"| 2 | 2 | {np.mean([loss[2, 0], loss[2, 1]]) / math.log(2):.4f} ± "
    line = next(line for line in report.splitlines() if line.startswith(row))
    per_seed = ", ".join(f"{x / math.log(2):+.4f}" for x in d)
    assert f"| {d.mean() / math.log(2):+.4f} [{low:+.4f}, {high:+.4f}] | {per_seed} | {verdict} |" in line, line
    entry = next(e for e in results["comparisons"] if e["heads"] == 2)
    assert entry["difference_interval"] == pytest.approx([low * math.log(2), high * math.log(2)], rel=1e-9)
    assert entry["seeds"] == 2 and entry["selected"] == {} and entry["verdict"] == verdict
    assert "Baselines on the same 40 test windows in" in report and "interpolated Witten-Bell" in report
    assert line in open(os.path.join(run.workdir, "results.md")).read()  # results.md: the same table


def test_baselines_curves_and_throughput_of_a_text_run(docs_run):
    run, _ = docs_run
    results = json.load(open(os.path.join(run.workdir, "results.json")))
    base = results["baselines"]["text"]
    assert base["unit"] == "bits/byte" and base["trigram_bits"] < base["bigram_bits"] < base["unigram_bits"]
    assert base["heldout_unigram_entropy_bits"] == results["members"][0]["heldout_unigram_entropy_bits"]
    for member in results["members"]:  # the console says which members are not below the bigram
        said = f"{member['name']}: held-out {member['eval_bits_per_byte']:.4f} bits/byte, not below the bigram"
        assert (said in run.console) == (member["eval_bits_per_byte"] >= base["bigram_bits"])
    # eval/bits_per_byte at every evaluation, the first at step 0 (theta_0: about 8 bits a byte)
    curves = run.curves("text-h2-s1")
    steps, bits = curves["eval/bits_per_byte"]
    assert list(steps) == [0, 75, 150] and 7 < bits[0] < 9
    np.testing.assert_allclose(bits, np.asarray(curves["eval/loss"][1]) / math.log(2), rtol=1e-6)
    # tokens/s = member-steps/s x batch x T; no peak for a CPU: MFU null; the console's last line says both
    assert results["tokens_per_s"] == pytest.approx(results["member_steps_per_s"] * 16 * 32)
    assert results["mfu"] is None and "perf/tokens_per_s" in curves
    line = next(line for line in run.console.splitlines() if line.startswith("trained 150 steps"))
    assert f"{results['tokens_per_s']:,.0f} tokens/s, MFU n/a" in line


def test_perplexity_beside_bits_in_results_tensorboard_and_the_table(docs_run):
    """(issue 56) eval_perplexity = 2 ** eval_bits_per_byte = exp(held-out loss), at the end and at every evaluation."""
    run, _ = docs_run
    results = json.load(open(os.path.join(run.workdir, "results.json")))
    for member in results["members"]:
        assert member["eval_perplexity"] == pytest.approx(2 ** member["eval_bits_per_byte"], rel=1e-12)
        assert member["eval_perplexity"] == pytest.approx(math.exp(member["eval_loss"]), rel=1e-4)
        steps, perplexity = run.curves(member["name"])["eval/perplexity"]
        _, loss = run.curves(member["name"])["eval/loss"]
        np.testing.assert_allclose(perplexity, np.exp(loss), rtol=1e-5)
    from mhjax.experiments import make_experiment
    from mhjax.train.console import summary_lines

    table = summary_lines(make_experiment(run.config).summary_table(), results["members"])  # mhjax train's end table
    assert "held-out perplexity" in table[0]
