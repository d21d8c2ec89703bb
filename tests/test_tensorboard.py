"""TensorBoard without TensorFlow: per-member runs, HParams, images, text; served for real."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from mhjax.experiments import make_experiment
from mhjax.plotting.images import diffusion_image
from mhjax.train.loop import run
from tests.conftest import tiny_sequence_config

MEMBERS = ["copy-h1-s0", "copy-h4-s0"]


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory, images_on):
    workdir = str(tmp_path_factory.mktemp("tb") / "w")
    run(make_experiment(tiny_sequence_config()), workdir, progress=False, log=lambda m: None)
    return workdir


def _accumulator(path):
    ea = EventAccumulator(path, size_guidance={"images": 0, "tensors": 0, "scalars": 0})
    ea.Reload()
    return ea


def test_event_files_hold_scalars_hparams_images_and_config(sweep_dir):
    assert sorted(os.listdir(os.path.join(sweep_dir, "tb"))) == MEMBERS  # one run per member, no subfolders
    results = {m["name"]: m for m in json.load(open(os.path.join(sweep_dir, "results.json")))["members"]}
    for name in MEMBERS:
        ea = _accumulator(os.path.join(sweep_dir, "tb", name))
        tags = ea.Tags()
        for tag in (
            "train/loss",
            "train/learning_rate",
            "eval/loss",
            "eval/accuracy",
            "final/train_loss",
            "final/eval_loss",
            "final/eval_accuracy",
            "final/program_wall_time_s",
        ):
            assert tag in tags["scalars"], (name, tag)
        assert "final/wall_time_s" not in tags["scalars"]  # results.json's older name is not a metric
        assert ea.Scalars("final/eval_accuracy")[-1].value == pytest.approx(results[name]["eval_accuracy"])
        assert ea.Scalars("final/eval_accuracy")[-1].step == 6
        # train/loss every step (chunks of 3): at step s the loss of theta_s; the last (theta_5's) is
        # results' train_loss, the loss of the last step's input; the first is theta_0's
        losses = ea.Scalars("train/loss")
        assert [e.step for e in losses] == [0, 1, 2, 3, 4, 5]
        assert losses[0].value == pytest.approx(results[name]["initial_train_loss"], rel=1e-6)
        assert losses[-1].value == pytest.approx(results[name]["train_loss"], rel=1e-6)
        assert {"attention/layer0", "diffusion/sink_signal", "eval/accuracy_by_position"} <= set(tags["images"])
        heatmap = ea.Images("attention/layer0")[-1]
        assert heatmap.width >= 64 and heatmap.height >= 64
        for tag in (
            "_hparams_/experiment",
            "_hparams_/session_start_info",
            "_hparams_/session_end_info",
            "config/text_summary",
        ):
            assert tag in tags["tensors"], (name, tag)
        text = ea.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
        assert '"width": 16' in text and "heads=" in text


def test_sink_signal_matches_dag_fidelity():
    from mhjax.analysis import dag

    rng = np.random.default_rng(0)
    A = np.tril(rng.random((6, 6)))
    A /= A.sum(axis=1, keepdims=True)
    signal = dag.sink_signals_float64(A, horizon=20)
    assert signal.shape == (20, 6)
    np.testing.assert_allclose(signal[2], np.linalg.matrix_power(A, 3)[-1], rtol=1e-12)
    np.testing.assert_allclose(signal.max(axis=0), np.asarray(dag.node_fidelity(A, 20)), rtol=1e-5)
    image = diffusion_image(A[None], "x", horizon=20)
    assert image.dtype == np.uint8 and image.ndim == 3 and image.shape[2] == 3


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url, body=None):
    headers = {"Content-Type": "application/json", "X-XSRF-Protected": "1"} if body is not None else {}
    data = None if body is None else json.dumps(body).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=data, headers=headers), timeout=30) as response:
        return json.loads(response.read())


def test_mhjax_images_0_leaves_the_images_out_and_every_scalar_in(sweep_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("MHJAX_IMAGES", "0")
    workdir = str(tmp_path / "w")
    run(make_experiment(tiny_sequence_config()), workdir, progress=False, log=lambda m: None)
    for name in MEMBERS:
        drawn, plain = (_accumulator(os.path.join(w, "tb", name)) for w in (sweep_dir, workdir))
        assert drawn.Tags()["images"] and not plain.Tags()["images"]
        assert plain.Tags()["scalars"] == drawn.Tags()["scalars"]
        for tag in plain.Tags()["scalars"]:
            if not tag.startswith("perf/") and "time" not in tag:  # wall times and rates differ
                assert [e.value for e in plain.Scalars(tag)] == [e.value for e in drawn.Scalars(tag)], tag


def test_tensorboard_server_serves_runs_scalars_images_and_hparams(sweep_dir, tmp_path):
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "tensorboard.log", "w")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tensorboard.main",
            "--logdir",
            os.path.join(sweep_dir, "tb"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--load_fast",
            "false",
            "--reload_interval",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline, runs = time.time() + 120, None
        while time.time() < deadline:
            assert proc.poll() is None, open(tmp_path / "tensorboard.log").read()
            try:
                runs = _get(f"{base}/data/runs")
                images = _get(f"{base}/data/plugin/images/tags")
                if sorted(runs) == MEMBERS and all(images.get(m) for m in MEMBERS):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        assert sorted(runs or []) == MEMBERS

        scalars = _get(f"{base}/data/plugin/scalars/tags")
        for name in MEMBERS:
            assert {"train/loss", "eval/loss", "eval/accuracy", "final/eval_accuracy"} <= set(scalars[name])
            assert {"attention/layer0", "diffusion/sink_signal"} <= set(images[name])
        sample = _get(f"{base}/data/plugin/images/images?run={MEMBERS[1]}&tag=attention/layer0")
        assert sample and sample[-1]["step"] == 6
        with urllib.request.urlopen(
            f"{base}/data/plugin/images/individualImage?{sample[-1]['query']}", timeout=30
        ) as r:
            assert r.read(8) == b"\x89PNG\r\n\x1a\n"
        assert MEMBERS[0] in _get(f"{base}/data/plugin/text/tags")

        experiment = _get(f"{base}/data/plugin/hparams/experiment", {"experimentName": ""})
        infos = {h["name"]: h for h in experiment["hparamInfos"]}
        assert set(infos) == {"task", "heads", "seed", "learning_rate"}
        assert infos["heads"]["domainDiscrete"] == [1.0, 4.0] and infos["heads"]["differs"]
        assert infos["task"]["domainDiscrete"] == ["copy"]
        metrics = {m["name"]["tag"] for m in experiment["metricInfos"]}
        assert {
            "final/train_loss",
            "final/eval_loss",
            "final/eval_accuracy",
            "analysis/layer0/mixing_time",
            "analysis/layer0/fidelity_pct",
        } <= metrics

        groups = _get(
            f"{base}/data/plugin/hparams/session_groups",
            {
                "experimentName": "",
                "startIndex": 0,
                "sliceSize": 100,
                "allowedStatuses": ["STATUS_UNKNOWN", "STATUS_SUCCESS", "STATUS_FAILURE", "STATUS_RUNNING"],
                "colParams": [{"hparam": "heads", "order": "ORDER_DESC"}],
            },
        )["sessionGroups"]
        assert [g["name"] for g in groups] == MEMBERS[::-1]  # sorted by heads, descending
        results = {m["name"]: m for m in json.load(open(os.path.join(sweep_dir, "results.json")))["members"]}
        for group in groups:
            assert group["hparams"]["heads"] == float(results[group["name"]]["heads"])
            assert group["sessions"][0]["status"] == "STATUS_SUCCESS"
            values = {v["name"]["tag"]: v["value"] for v in group["metricValues"]}
            assert values["final/eval_accuracy"] == pytest.approx(results[group["name"]]["eval_accuracy"])
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_a_run_resumed_within_the_same_second_keeps_the_earlier_runs_points(tmp_path):
    """tensorboardX names event files by the second: a resume (purge at 2) opened within the
    second of the run it resumes must not write over that run's file."""
    from mhjax.io.tensorboard import MemberWriters
    from tests.tb_scalars import scalar_events

    first = MemberWriters(str(tmp_path), ["m"])
    for step in range(3):
        first.scalars("m", {"train/loss": float(step)}, step)
    first.close()
    second = MemberWriters(str(tmp_path), ["m"], purge_step=2)
    for step in (2, 3):
        second.scalars("m", {"train/loss": 10.0 + step}, step)
    second.close()
    assert len(os.listdir(tmp_path / "m")) == 2
    assert scalar_events(str(tmp_path / "m"))["train/loss"] == [(0, 0.0), (1, 1.0), (2, 12.0), (3, 13.0)]


def test_a_run_again_at_the_last_step_writes_final_scalars_once(tmp_path):
    """A sweep already at its last step run again (after a stop there, a requeue, a finished shard
    rerun) trains nothing and is not purged: its final/ scalars are not written twice; a member
    whose run lacks them (killed after the last checkpoint, before the end) gets them."""
    from mhjax.io.tensorboard import MemberWriters
    from tests.tb_scalars import scalar_events

    records = [{"name": n, "heads": 2, "train_loss": 1.5, "eval_loss": 2.0} for n in ("a", "b")]
    hparams = {n: {"heads": 2} for n in ("a", "b")}
    first = MemberWriters(str(tmp_path), ["a"])  # "b": the run killed before its end wrote nothing final
    first.finish(records[:1], {"a": hparams["a"]}, [], 12)
    first.close()
    again = MemberWriters(str(tmp_path), ["a", "b"])
    again.finish(records, hparams, [], 12, again=True)
    again.close()
    for name in ("a", "b"):
        events = scalar_events(str(tmp_path / name))
        assert events["final/train_loss"] == [(12, 1.5)] and events["final/eval_loss"] == [(12, 2.0)], name
