"""A task parameter swept over two values, trained; ``run.forward`` on given tokens checked against
the analysis's own forward and the ablated losses analysis.json records; per-position results; the
report grouping by the parameter; ``run.model`` a pure apply."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mhjax
from mhjax.analysis.forward import head_mask
from mhjax.analysis.metrics import task_sequences
from mhjax.api.wording import python_wording
from mhjax.data import tasks
from mhjax.models.probe import config_sizes, predict
from tests.conftest import tiny_sequence_config, tiny_train


@pytest.fixture(scope="module")
def recall_run(tmp_path_factory):
    config = tiny_train(tiny_sequence_config(task=("recall", "copy"), heads=(2,)), 6, 3, 3, 6)
    config.task_params = {"recall": {"pairs": (1, 2)}}
    workdir = tmp_path_factory.mktemp("forward") / "w"
    run = mhjax.sweep(config, workdir, progress=False)
    run.analyze(num_sequences=6, plot=False, tensorboard=False)
    return run


def test_members_per_parameter_value_with_results_per_position(recall_run):
    run = recall_run
    assert run.member_names == ["recall-pairs1-h2-s0", "recall-pairs2-h2-s0", "copy-h2-s0"]
    for record, pairs in zip(run.results, (1, 2)):
        assert record["task_params"] == {"pairs": pairs}
        accuracy = record["eval_accuracy_by_position"]
        assert len(accuracy) == 8 and len(record["eval_loss_by_position"]) == 8
        assert accuracy[: 2 * pairs] == [None] * 2 * pairs and None not in accuracy[2 * pairs :]
        # every weighted position holds the same number of sequences: the mean over positions is the accuracy
        assert np.mean(accuracy[2 * pairs :]) == pytest.approx(record["eval_accuracy"], rel=1e-5)
        assert np.mean(record["eval_loss_by_position"][2 * pairs :]) == pytest.approx(record["eval_loss"], rel=1e-5)
    assert "task_params" not in run.results[2] and None not in run.results[2]["eval_accuracy_by_position"]
    with open(os.path.join(run.workdir, "mhjax.json")) as f:
        assert json.load(f)["config"]["task_params"] == {"recall": {"pairs": [1, 2]}}
    from mhjax.io.workdir import Workdir

    fields = Workdir(run.workdir).sweep_fields()
    assert sorted(fields) == ["heads", "learning_rate", "seed", "task", "task_params"]
    assert fields[fields.index("task") + 1] == "task_params"
    table = mhjax.load(run.workdir).to_pandas()
    assert table.shape[0] == 3 and list(table["task_params.pairs"][:2]) == [1, 2]


def test_the_report_groups_by_the_parameter_and_plots_accuracy_by_position(recall_run):
    from mhjax import cli

    assert cli.main(["report", "--workdir", recall_run.workdir]) == 0
    text = open(os.path.join(recall_run.workdir, "report.md")).read()
    assert "| task | task_params | heads | members |" in text
    assert "| recall | pairs=1 | 2 | 1 |" in text and "| copy | - | 2 | 1 |" in text
    assert "![accuracy_by_position](report/accuracy_by_position.png)" in text
    assert "## recall (pairs=2)" in text or "recall (pairs=2)" in text


def test_forward_matches_the_analysis_attention_and_ablated_losses(recall_run):
    run, sizes = recall_run, config_sizes(recall_run.config.model)
    for name, pairs in (("recall-pairs1-h2-s0", 1), ("recall-pairs2-h2-s0", 2)):
        entry = run.analysis["members"][name]
        task = tasks.get_task("recall").with_params({"pairs": pairs})
        batch, _ = task_sequences(task, None, 6, 0, 8, 16)  # the analysis's own sequences (seed 0)
        out = run.forward(name, batch.inputs, batch.targets, batch.weights)
        _, attention = predict(run.params(name), 2, batch.inputs, sizes)
        np.testing.assert_allclose(np.stack(out.attention), attention, rtol=1e-6, atol=1e-7)
        assert [a.shape for a in out.attention] == [(6, 2, 8, 8)] and out.head_outputs[0].shape == (6, 8, 2, 8)
        assert out.residual[0].shape == (6, 8, 16) and out.logits.shape == (6, 8, 16)
        weights = batch.weights

        def weighted(loss, weights=weights):
            return float((loss * weights).sum() / weights.sum())

        assert weighted(out.loss) == pytest.approx(entry["loss"], rel=1e-5)
        for head in range(2):
            only = run.forward(name, batch.inputs, batch.targets, batch.weights, heads_off={0: [1 - head]})
            assert weighted(only.loss) == pytest.approx(entry["layers"][0]["ablation"]["loss_only"][head], rel=1e-5)
            assert not only.head_outputs[0][:, :, 1 - head].any() and only.head_outputs[0][:, :, head].any()
        assert np.isnan(out.accuracy_by_position[: 2 * pairs]).all()
        # run.model: the same model as another program: equal to float32 round-off (docs/sweeps.md)
        logits = np.asarray(run.model(name)(run.params(name), batch.inputs))
        ulp = np.spacing(np.abs(out.logits).max())
        assert np.abs(logits - out.logits).max() <= 8 * ulp and (logits.argmax(-1) == out.logits.argmax(-1)).all()


def test_forward_takes_targets_from_a_task_that_makes_them_and_refuses_bad_input(recall_run):
    run = recall_run
    tokens = np.arange(16, dtype=np.int32).reshape(2, 8)
    copy = run.forward("copy-h2-s0", tokens)  # copy: the targets are the tokens
    np.testing.assert_allclose(copy.loss, run.forward("copy-h2-s0", tokens, tokens).loss)
    assert copy.accuracy_by_position.shape == (8,)
    assert run.forward("recall-pairs1-h2-s0", tokens).loss is None  # recall makes no targets from tokens
    with pytest.raises(mhjax.ConfigError, match=r"^heads_off: layer 0: head 2 is not one of 0..1"):
        run.forward("copy-h2-s0", tokens, heads_off={0: [2]})
    with pytest.raises(mhjax.ConfigError, match=r"^tokens: need 1 <= T <= 8 and tokens in \[0, 15\]"):
        run.forward("copy-h2-s0", tokens + 9)
    with pytest.raises(mhjax.ConfigError, match=r"^member: unknown 'nope'"):
        run.forward("nope", tokens)
    with pytest.raises(mhjax.ConfigError, match=r"^tokens: expected .* integer array, got dtype float32 and shape"):
        run.forward("copy-h2-s0", tokens.astype(np.float32))  # float tokens: the dtype named
    with pytest.raises(mhjax.ConfigError, match=r"^targets: need integer tokens in \[0, 15\], got dtype float64"):
        run.forward("copy-h2-s0", tokens, tokens * 1.0)
    assert not copy.allow_changed_task and copy.task_sha256 is None  # copy is mhjax's own: no source hash
    np.testing.assert_array_equal(head_mask({1: 0}, 2, 3), [[1, 1, 1], [0, 1, 1]])
    assert jnp.asarray(copy.logits).dtype == jnp.float32


def test_forward_leaves_out_the_positions_a_tasks_targets_leave_undefined(recall_run, monkeypatch):
    """A task whose targets(tokens) also gives weights (here copy's, weight 0 at positions 0-2):
    run.forward's default loss by position leaves those positions out (NaN), the weights are on
    the Forward, and the other positions equal the unweighted call's."""
    import dataclasses

    copy = tasks.get_task("copy")

    def weighted_copy(tokens):
        return tokens, jnp.ones(jnp.shape(tokens), jnp.float32).at[..., :3].set(0.0)

    monkeypatch.setitem(tasks._REGISTRY, "copy", dataclasses.replace(copy, targets=weighted_copy))
    tokens = np.arange(16, dtype=np.int32).reshape(2, 8)
    out = recall_run.forward("copy-h2-s0", tokens)
    every = recall_run.forward("copy-h2-s0", tokens, tokens)  # given targets: every position counts
    np.testing.assert_array_equal(out.weights, np.repeat([[0, 0, 0, 1, 1, 1, 1, 1]], 2, axis=0))
    assert np.isnan(out.loss_by_position[:3]).all() and np.isnan(out.accuracy_by_position[:3]).all()
    np.testing.assert_allclose(out.loss_by_position[3:], every.loss_by_position[3:], rtol=1e-6)
    assert not np.isnan(every.loss_by_position).any() and every.weights.min() == 1
    np.testing.assert_array_equal(out.loss, every.loss)  # the per-token loss, unweighted, as documented


def test_api_errors_name_python_arguments_and_list_the_options(recall_run, tmp_path):
    run = recall_run
    with pytest.raises(mhjax.ConfigError, match=r"^workdir: no such directory: "):
        mhjax.load(tmp_path / "missing")
    with pytest.raises(mhjax.ConfigError, match=r"^run.analyze: unknown option 'num_seqs' \(options: out, sequences, "):
        run.analyze(num_seqs=8)
    with pytest.raises(mhjax.ConfigError, match=r"^num_sequences: must be a positive integer, got 0"):
        run.analyze(num_sequences=0, plot=False, tensorboard=False)
    # every flag a shared message names, in Python's words (not only its leading one)
    with pytest.raises(mhjax.ConfigError) as exc:
        run.analyze(steps=[12345], plot=False, tensorboard=False)
    assert str(exc.value).startswith("steps: 12345 is not a kept step, last or all (kept: ") and "--" not in str(
        exc.value
    )
    message = "results.json: train it first (mhjax train --config ... --workdir W); run `mhjax analyze --workdir W`"
    assert python_wording(message) == "results.json: train it first (mhjax.sweep(config, 'W')); run `run.analyze()`"
    report = run.report()
    assert report["md"] == os.path.join(run.workdir, "report.md") and os.path.isfile(report["md"])


def reference_forward(params, heads, tokens, patch=None):
    """The Transformer written out in jax.numpy from its param tree (eval mode, no patching code):
    (logits, per-layer head outputs (N, T, H, D/H)). ``patch`` {layer: (mask (T, H) bool, head
    outputs)} replaces those heads' outputs before the layer's output projection."""

    def rms(x, scale):
        return x / jnp.sqrt(jnp.mean(x * x, axis=-1, keepdims=True) + np.finfo(np.float32).eps) * scale

    def dense(x, p):
        return x @ p["kernel"] + p["bias"]

    n, t = tokens.shape
    x = params["token_emb"]["embedding"][tokens] + params["pos_emb"]["embedding"][:t]
    width = x.shape[-1]
    outputs, causal = [], np.tril(np.ones((t, t), bool))
    for layer in range(sum(k.startswith("block_") for k in params)):
        block = params[f"block_{layer}"]
        h = rms(x, block["ln1"]["scale"])
        q, k, v = (dense(h, block["attn"][name]).reshape(n, t, heads, -1) for name in ("query", "key", "value"))
        scores = jnp.einsum("nihd,njhd->nhij", q, k) / np.sqrt(width // heads)
        probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
        out = jnp.einsum("nhij,njhd->nihd", probs, v)
        if patch and layer in patch:
            mask, source = patch[layer]
            out = jnp.where(mask[None, :, :, None], source[layer], out)
        outputs.append(out)
        x = x + dense(out.reshape(n, t, width), block["attn"]["out"])
        h = jax.nn.relu(dense(rms(x, block["ln2"]["scale"]), block["mlp_in"]))
        x = x + dense(h, block["mlp_out"])
    return dense(x, params["readout"]), outputs


def test_patching_heads_and_positions_matches_a_hand_written_forward_and_compiles_once():
    from mhjax.analysis.forward import forward, forward_fn
    from mhjax.models.model_config import ModelConfig
    from mhjax.models.probe import eval_model

    sizes = dict(vocab_size=16, max_len=8, width=16, num_layers=2, mlp_dim=32)
    rng = np.random.default_rng(0)
    tokens, other, targets = (rng.integers(0, 16, (3, 8)) for _ in range(3))
    for heads in (2, 4):
        init = eval_model(ModelConfig.from_sizes(sizes), heads).init
        params = init(jax.random.key(heads), jnp.zeros((1, 8), jnp.int32))["params"]
        plain = forward(params, heads, sizes, tokens, targets)
        _, source = reference_forward(params, heads, other)
        patch, positions = {0: [1], 1: [0, heads - 1]}, [2, 5]
        out = forward(params, heads, sizes, tokens, targets, patch=patch, patch_tokens=other, patch_positions=positions)
        at = np.isin(np.arange(8), positions)[:, None]
        masks = {layer: at & np.isin(np.arange(heads), named)[None] for layer, named in patch.items()}
        logits, outputs = reference_forward(params, heads, tokens, {l: (m, source) for l, m in masks.items()})
        np.testing.assert_allclose(out.logits, logits, rtol=1e-5, atol=1e-5)
        for layer in range(2):
            np.testing.assert_allclose(out.head_outputs[layer], outputs[layer], rtol=1e-5, atol=1e-6)
        loss = -np.take_along_axis(np.asarray(jax.nn.log_softmax(logits)), targets[..., None], -1)[..., 0]
        np.testing.assert_allclose(out.loss, loss, rtol=1e-5, atol=1e-6)  # against the clean targets
        assert not np.allclose(out.logits[:, [2, 5]], plain.logits[:, [2, 5]])  # the patch acts
        np.testing.assert_array_equal(out.logits[:, :2], plain.logits[:, :2])  # not before the first position
        # patching with the clean tokens themselves, every head everywhere, changes nothing: exactly
        every = {layer: list(range(heads)) for layer in range(2)}
        same = forward(params, heads, sizes, tokens, targets, patch=every, patch_tokens=tokens)
        np.testing.assert_array_equal(same.logits, plain.logits)
        np.testing.assert_array_equal(same.loss, plain.loss)
        # another patch set, positions and patch tokens: the same compiled program
        compiled = forward_fn(*sizes.values(), heads, True, sizes.get("attention_width"))
        forward(params, heads, sizes, tokens, patch={1: [1]}, patch_tokens=targets, patch_positions=[0])
        assert compiled._cache_size() == 1


def test_patching_a_member_with_its_own_tokens_changes_nothing_and_bad_patches_are_refused(recall_run):
    run, tokens = recall_run, np.arange(16, dtype=np.int32).reshape(2, 8) % 16
    other = np.flip(tokens, axis=1).copy()
    plain = run.forward("copy-h2-s0", tokens)
    for head in range(2):
        same = run.forward("copy-h2-s0", tokens, patch={0: [head]}, patch_tokens=tokens, patch_positions=[3, 7])
        np.testing.assert_array_equal(same.logits, plain.logits)
        np.testing.assert_array_equal(same.loss, plain.loss)
    patched = run.forward("copy-h2-s0", tokens, patch={0: [0, 1]}, patch_tokens=other)
    np.testing.assert_allclose(
        patched.loss, run.forward("copy-h2-s0", tokens, tokens, patch={0: [0, 1]}, patch_tokens=other).loss
    )  # the clean tokens' targets
    np.testing.assert_array_equal(patched.head_outputs[0], run.forward("copy-h2-s0", other).head_outputs[0])
    refused = {
        r"^patch: layer 1 is not one of 0..0$": dict(patch={1: [0]}, patch_tokens=other),
        r"^patch: layer 0: head 2 is not one of 0..1$": dict(patch={0: [2]}, patch_tokens=other),
        r"^patch_tokens: required with patch; ": dict(patch={0: [0]}),
        r"^patch_tokens: given without patch; ": dict(patch_tokens=other),
        r"^patch_positions: given without patch; ": dict(patch_positions=[0]),
        r"^patch_tokens: expected integer tokens of the tokens' shape \(2, 8\), got dtype int32 and shape \(1, 8": dict(
            patch={0: [0]}, patch_tokens=other[:1]
        ),
        r"^patch_tokens: expected integer tokens .* got dtype float32 and shape \(2, 8\)$": dict(
            patch={0: [0]}, patch_tokens=other.astype(np.float32)
        ),
        r"^patch_tokens: need 1 <= T <= 8 and tokens in \[0, 15\]": dict(patch={0: [0]}, patch_tokens=other + 9),
        r"^patch_positions: position 8 is not one of 0..7$": dict(
            patch={0: [0]}, patch_tokens=other, patch_positions=[1, 8]
        ),
        r"^patch_positions: position 3 is listed twice \(\[3, 1, 3\]\); list each position once$": dict(
            patch={0: [0]}, patch_tokens=other, patch_positions=np.array([3, 1, 3])
        ),
    }
    for message, kwargs in refused.items():
        with pytest.raises(mhjax.ConfigError, match=message) as exc:
            run.forward("copy-h2-s0", tokens, **kwargs)
        assert "\n" not in str(exc.value)
