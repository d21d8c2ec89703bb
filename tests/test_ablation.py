"""Head ablation and attention rollout (analysis/ablation.py, analysis/rollout.py), checked against a
hand-written numpy forward of the Transformer that shares no code with the JAX model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from mhjax.analysis import ablation, metrics, rollout
from mhjax.analysis.ranks import spearman
from mhjax.data.sequences import TASKS, targets_for
from mhjax.models.model_config import ModelConfig
from mhjax.models.probe import eval_model, model_sizes, predict
from mhjax.plotting.heads import head_tables, member_lines
from mhjax.plotting.images import sink_row_image

VOCAB, T, WIDTH, LAYERS, MLP = 11, 6, 8, 2, 12
SIZES = ModelConfig(vocab_size=VOCAB, max_len=T, width=WIDTH, num_layers=LAYERS, mlp_dim=MLP)


def tiny_params(heads: int, seed: int = 0) -> dict:
    """A random parameter tree (every leaf N(0, 0.7^2), norms included) of the tiny model."""
    shapes = eval_model(SIZES, heads).init(jax.random.PRNGKey(0), jnp.zeros((1, T), jnp.int32))
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(lambda x: (0.7 * rng.standard_normal(x.shape)).astype(np.float32), shapes["params"])


# ------------------------------ the numpy reference ---------------------------
def _rms(x, scale):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.finfo(np.float32).eps) * scale


def np_forward(p, tokens, heads, head_mask=None, zero_core=None):
    """logits (N, T, V) and attention (L, N, H, T, T) in float64; ``head_mask`` (L, H) scales
    each head's output before the output projection; ``zero_core``: a layer whose attention core
    returns zeros (only the output projection's bias is left)."""
    p = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), p)
    n, length = tokens.shape
    d = WIDTH // heads
    x = p["token_emb"]["embedding"][tokens] + p["pos_emb"]["embedding"][:length]
    causal = np.tril(np.ones((length, length), bool))
    attention = []
    for l in range(LAYERS):
        b = p[f"block_{l}"]
        h = _rms(x, b["ln1"]["scale"])
        q, k, v = (h @ b["attn"][name]["kernel"] + b["attn"][name]["bias"] for name in ("query", "key", "value"))
        core = np.zeros_like(q)
        probs = np.zeros((n, heads, length, length))
        for head in range(heads):
            cols = slice(head * d, (head + 1) * d)
            scores = np.einsum("nid,njd->nij", q[..., cols], k[..., cols]) / np.sqrt(d)
            scores = np.where(causal, scores, -np.inf)
            a = np.exp(scores - scores.max(-1, keepdims=True))
            a /= a.sum(-1, keepdims=True)
            probs[:, head] = a
            scale = 1.0 if head_mask is None else head_mask[l][head]
            core[..., cols] = scale * np.einsum("nij,njd->nid", a, v[..., cols])
        if l == zero_core:
            core = np.zeros_like(core)
        attention.append(probs)
        x = x + core @ b["attn"]["out"]["kernel"] + b["attn"]["out"]["bias"]
        h = _rms(x, b["ln2"]["scale"])
        h = np.maximum(h @ b["mlp_in"]["kernel"] + b["mlp_in"]["bias"], 0.0)
        x = x + h @ b["mlp_out"]["kernel"] + b["mlp_out"]["bias"]
    return x @ p["readout"]["kernel"] + p["readout"]["bias"], np.stack(attention)


def np_loss_accuracy(logits, targets, weights):
    top = logits.max(-1, keepdims=True)
    lse = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
    loss = lse - np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    correct = logits.argmax(-1) == targets
    return (weights * loss).sum() / weights.sum(), (weights * correct).sum() / weights.sum()


def _data(n=5, task="cycle"):
    tokens = metrics.random_tokens(n, T, VOCAB, seed=3)
    return tokens, np.asarray(targets_for(TASKS.index(task), tokens))


# ------------------------------ head ablation --------------------------------
def test_ablation_matches_numpy_forward():
    heads = 4
    params = tiny_params(heads)
    sizes = model_sizes(params)
    tokens, targets = _data()
    weights = np.random.default_rng(1).uniform(0.2, 1.0, tokens.shape)  # the weights path, padded tail (5 = 2+2+1)
    full, layers = ablation.head_ablation(params, heads, tokens, targets, sizes, weights, batch_size=2)
    loss, acc = np_loss_accuracy(np_forward(params, tokens, heads)[0], targets, weights)
    np.testing.assert_allclose(full["loss"], loss, rtol=1e-5)
    assert full["accuracy"] == pytest.approx(acc, abs=1e-6)
    masks = ablation.head_masks(LAYERS, heads)
    for l in range(LAYERS):
        for h in range(heads):
            for kind, mask in (("without", masks[0, l, h]), ("only", masks[1, l, h])):
                loss, acc = np_loss_accuracy(np_forward(params, tokens, heads, mask)[0], targets, weights)
                np.testing.assert_allclose(layers[l]["ablation"][f"loss_{kind}"][h], loss, rtol=1e-5)
                assert layers[l]["ablation"][f"accuracy_{kind}"][h] == pytest.approx(acc, abs=1e-6)
        best = max(layers[l]["ablation"]["accuracy_only"])
        assert layers[l]["accuracy_synergy"] == pytest.approx(full["accuracy"] - best)


def test_head_masks_remove_one_head_or_keep_one():
    masks = ablation.head_masks(3, 2)
    assert masks.shape == (2, 3, 2, 3, 2)
    assert masks[0, 1, 0].tolist() == [[1, 1], [0, 1], [1, 1]]
    assert masks[1, 1, 0].tolist() == [[1, 1], [1, 0], [1, 1]]


def test_removing_a_head_with_zero_value_projection_changes_nothing():
    heads, layer, head = 4, 1, 2
    params = tiny_params(heads, seed=4)
    value = params[f"block_{layer}"]["attn"]["value"]
    cols = slice(head * WIDTH // heads, (head + 1) * WIDTH // heads)
    value["kernel"][:, cols] = 0.0
    value["bias"][cols] = 0.0
    tokens, targets = _data()
    full, layers = ablation.head_ablation(params, heads, tokens, targets, model_sizes(params))
    assert layers[layer]["ablation"]["loss_without"][head] == pytest.approx(full["loss"], rel=1e-6)
    assert layers[layer]["ablation"]["accuracy_without"][head] == full["accuracy"]
    assert layers[0]["ablation"]["loss_without"][head] != pytest.approx(full["loss"], rel=1e-6)  # others matter


def test_keeping_the_only_head_of_a_one_head_layer_is_the_full_model():
    params = tiny_params(1, seed=5)
    tokens, targets = _data()
    full, layers = ablation.head_ablation(params, 1, tokens, targets, model_sizes(params))
    for layer in layers:
        assert layer["ablation"]["loss_only"] == [pytest.approx(full["loss"], rel=1e-6)]
        assert layer["ablation"]["accuracy_only"] == [full["accuracy"]]
        assert layer["accuracy_synergy"] == 0.0 and layer["head_weight_ablation_spearman"] is None


@pytest.mark.parametrize("heads", [1, 4])
def test_removing_every_head_of_a_layer_leaves_the_output_bias(heads):
    params = tiny_params(heads, seed=6)
    tokens, targets = _data()
    model = eval_model(SIZES, heads)
    mask = np.ones((LAYERS, heads), np.float32)
    mask[0] = 0.0
    logits = model.apply({"params": params}, tokens, head_mask=mask)
    np.testing.assert_allclose(logits, np_forward(params, tokens, heads, zero_core=0)[0], rtol=1e-4, atol=1e-4)
    if heads == 1:  # removing the only head is removing every head
        _, layers = ablation.head_ablation(params, 1, tokens, targets, model_sizes(params))
        loss, _ = np_loss_accuracy(np_forward(params, tokens, 1, zero_core=0)[0], targets, np.ones(tokens.shape))
        np.testing.assert_allclose(layers[0]["ablation"]["loss_without"][0], loss, rtol=1e-5)


def test_no_mask_and_all_ones_mask_agree_with_numpy():
    params = tiny_params(2, seed=7)
    tokens, _ = _data()
    model = eval_model(SIZES, 2)
    plain = model.apply({"params": params}, tokens)
    ones = model.apply({"params": params}, tokens, head_mask=np.ones((LAYERS, 2), np.float32))
    np.testing.assert_allclose(plain, ones, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(plain, np_forward(params, tokens, 2)[0], rtol=1e-4, atol=1e-4)


def test_synergy_verdict_needs_two_seeds():
    assert ablation.synergy_verdict([0.1]) is None and ablation.synergy_verdict([None, 0.2]) is None
    assert ablation.synergy_verdict([0.1, 0.3]) is True  # mean 0.2 > std 0.1
    assert ablation.synergy_verdict([-0.1, 0.3]) is False  # mean 0.1 < std 0.2
    assert ablation.synergy_verdict([0.0, 0.0, 0.0]) is False


# ------------------------------ rollout --------------------------------------
def _causal_attention(rng, shape):
    a = np.tril(rng.uniform(0.0, 1.0, shape))
    return a / a.sum(-1, keepdims=True)


def test_rollout_of_identity_attention_is_the_identity():
    attn = np.broadcast_to(np.eye(5), (3, 2, 4, 5, 5))  # L, N, H, T, T
    out = np.asarray(rollout.rollout(attn, np.full((3, 4), 0.25)))
    np.testing.assert_allclose(out, np.broadcast_to(np.eye(5), (3, 2, 5, 5)), atol=1e-7)


def test_rollout_matches_numpy_products_and_rows_sum_to_one():
    rng = np.random.default_rng(2)
    L, N, H, n = 3, 2, 4, 6
    attn = _causal_attention(rng, (L, N, H, n, n))
    beta = rng.uniform(0.1, 1.0, (L, H))
    beta /= beta.sum(-1, keepdims=True)
    for weights in (beta, np.full((L, H), 1.0 / H)):
        expected, acc = [], np.broadcast_to(np.eye(n), (N, n, n))
        for l in range(L):
            step = 0.5 * np.einsum("h,nhij->nij", weights[l], attn[l]) + 0.5 * np.eye(n)
            acc = step @ acc
            expected.append(acc)
        out = np.asarray(rollout.rollout(attn, None if weights is not beta else beta))
        np.testing.assert_allclose(out, np.stack(expected), rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(out.sum(-1), 1.0, rtol=1e-5)
    sink = jax.device_get(rollout.sink_rollout(attn, beta, include_sink=False))
    rows = np.asarray(rollout.rollout(attn, beta))[..., -1, :]
    np.testing.assert_allclose(sink["sink_row"], rows, rtol=1e-6)
    np.testing.assert_allclose(sink["min"], rows[..., :-1].min(-1), rtol=1e-6)
    plain = np.asarray(rollout.rollout(attn))[..., -1, :]
    np.testing.assert_allclose(sink["min_mean_heads"], plain[..., :-1].min(-1), rtol=1e-6)


def test_spearman_matches_scipy_with_ties():
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 4, 30).astype(float), rng.standard_normal(30)
    assert spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y).statistic)
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) is None and spearman([1], [2]) is None


# ------------------------------ analyze_params and the report ----------------
def test_analyze_params_fields_match_the_pieces():
    heads = 2
    params = tiny_params(heads, seed=8)
    tokens, targets = _data(n=4, task="copy")
    res = metrics.analyze_params(params, heads, "copy", tokens, batch_size=3, keep_attention=True)
    preds, attn = predict(params, heads, tokens)
    assert res["accuracy"] == pytest.approx(float((preds == targets).mean()))
    loss, _ = np_loss_accuracy(np_forward(params, tokens, heads)[0], targets, np.ones(tokens.shape))
    assert res["loss"] == pytest.approx(loss, rel=1e-5)
    beta = metrics.learned_head_weights(params, heads)
    rows = np.asarray(rollout.rollout(np_forward(params, tokens, heads)[1], beta))[..., -1, :]  # (L, N, T)
    fidelity = 100 * np.asarray(jax.device_get(metrics.layer_metrics(attn, beta)["fidelity"]))
    assert res["rollout_min"] == pytest.approx(rows[-1].min(-1).mean(), rel=1e-4)
    np.testing.assert_allclose(res["rollout_sink_row"], rows.mean(1), rtol=1e-4, atol=1e-7)
    for l, layer in enumerate(res["layers"]):
        assert layer["rollout_min"] == pytest.approx(rows[l].min(-1).mean(), rel=1e-4)
        assert layer["rollout_fidelity_spearman"] == pytest.approx(spearman(rows[l].min(-1), fidelity[l]))
        assert set(layer["ablation"]) == {"loss_without", "accuracy_without", "loss_only", "accuracy_only"}
        assert all(len(v) == heads for v in layer["ablation"].values())
    lines = "\n".join(member_lines(res))
    assert "rollout min %" in lines and "| 1 |" in lines
    skipped = metrics.analyze_params(params, heads, "copy", tokens, ablate=False)
    assert skipped["loss"] == pytest.approx(res["loss"]) and "ablation" not in skipped["layers"][0]
    assert "accuracy_synergy" not in skipped["layers"][0] and "rollout_min" in skipped["layers"][0]
    image = sink_row_image(res["rollout_sink_row"])
    assert image.dtype == np.uint8 and image.shape[2] == 3 and image.shape[0] > LAYERS


def _entry(heads, seed, synergy, name=None):
    layer = {
        "layer": 0,
        "combined_beats_best_share": 0.5,
        "accuracy_synergy": synergy,
        "rollout_min": 0.01,
        "rollout_min_mean_heads": 0.02,
        "rollout_fidelity_spearman": 0.5,
        "head_weight_ablation_spearman": 0.4 if heads > 1 else None,
    }
    return {
        "name": name or f"copy-h{heads}-s{seed}",
        "task": "copy",
        "heads": heads,
        "rollout_min": 0.01,
        "rollout_min_mean_heads": 0.02,
        "layers": [layer],
    }


def test_report_tables_put_accuracy_synergy_beside_the_dag():
    members = [_entry(4, 0, 0.1), _entry(4, 1, 0.3), _entry(8, 0, -0.1), _entry(8, 1, 0.3), _entry(1, 0, 0.0)]
    text = head_tables({"members": {e["name"]: e for e in members}})
    assert "| 4 | 20.00 ± 10.00 ✓ | 50 |" in text  # synergistic: mean beats the std over seeds (50: constant, no ±)
    assert "| 8 | 10.00 ± 20.00 ✗ | 50 |" in text
    assert "| 1 | 0.00 | 50 |" in text  # one seed: no verdict
    assert "| 4 | 1.000 | 2.000 | 1.000 | 0.50 |" in text
    assert "β vs removal" in text
    assert head_tables({"members": {"old": {"task": "copy", "heads": 1, "layers": [{}]}}}) == ""
