"""One TensorBoard run per sweep member at W/tb/<member-name>, written without TensorFlow.

Each run holds, besides the training/evaluation scalars the host loop logs:

* ``config`` (text): the resolved config, and the member's own hyperparameters;
* the HParams plugin's data, written straight as its protos (no TensorFlow): a session
  start (the member's swept fields: task, heads, seed, learning_rate, ...) when training
  starts; at the end the experiment (every hyperparameter with its discrete domain over the
  sweep, and every metric tag), final metric scalars ``final/<field>`` (train/eval loss and
  accuracy, wall time, any numeric extra an experiment adds, e.g. an NTK margin) and the
  session end (status failure for a diverged member). ``mhjax analyze`` later adds
  ``analysis/...`` scalars (mixing time, fidelity per layer), which the experiment already
  lists as metrics, so head counts can be compared, sorted and filtered in one table;
* images at the end of training (sequence experiments): the attention of every head and the
  combined operator per layer on one fixed evaluation sequence (``attention/layer{l}``) and
  diffusion curves, the signal reaching the sink after t steps of the combined operator
  (``diffusion/sink_signal``).
"""
from __future__ import annotations

import json
import os
import time

import numpy as np
from tensorboardX import SummaryWriter

# Fields of a results.json record that are not metrics.
_NOT_METRICS = {"name", "program", "status", "steps", "params", "diverged_at_step"}
DIFFUSION_HORIZON = 100  # the reference fidelity horizon
EXAMPLE_SEED = 0  # the fixed evaluation sequence (numpy, so no compile)


class MemberWriters:
    def __init__(self, workdir: str, names: list[str]):
        self.root = os.path.join(workdir, "tb")
        self.writers = {name: SummaryWriter(os.path.join(self.root, name), flush_secs=30) for name in names}

    def __getitem__(self, name: str) -> SummaryWriter:
        return self.writers[name]

    def scalars(self, name: str, values: dict, step: int) -> None:
        writer = self.writers[name]
        for tag, value in values.items():
            writer.add_scalar(tag, float(value), step)

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()

    # ------------------------------------------------------------------ #
    # Start and end of a training run
    # ------------------------------------------------------------------ #
    def start(self, experiment, step: int = 0) -> None:
        """Config text and the HParams session start of every member."""
        text = config_markdown(experiment.config)
        now = time.time()
        for member in experiment.members:
            writer = self.writers[member.name]
            writer.add_text("config", text + "\n\n" + _hparams_markdown(member.hparams), step)
            _add_summary(writer, session_start_summary(member.hparams, group_name=member.name, start_time_secs=now), step)
        self.flush()

    def finish(self, experiment, sweep, states, payload: dict, log=None) -> None:
        """Final metric scalars, the HParams experiment and session ends, and end-of-training images."""
        step = int(payload.get("steps", 0))
        records = {r["name"]: r for r in payload["members"]}
        metrics = final_metrics(payload["members"], experiment)
        experiment_pb = experiment_summary(experiment, [f"final/{k}" for k in metrics] + extra_metric_tags(experiment),
                                           description=f"{payload.get('title', 'mhjax sweep')}: {len(records)} members, {step} steps")
        for member in experiment.members:
            writer = self.writers[member.name]
            record = records.get(member.name, {})
            for key in metrics:
                value = record.get(key)
                writer.add_scalar(f"final/{key}", float("nan") if value is None else float(value), step)
            _add_summary(writer, experiment_pb, step)
            _add_summary(writer, session_end_summary("failure" if record.get("status") == "diverged" else "success"), step)
        self.flush()
        try:
            self.images(experiment, sweep, states, step)
        except Exception as exc:  # figures must never cost a finished training run
            if log is not None:
                log(f"tensorboard: end-of-training images skipped ({type(exc).__name__}: {exc})")
        self.flush()

    def images(self, experiment, sweep, states, step: int) -> None:
        """Attention heatmaps and diffusion curves of every member on one fixed sequence."""
        if getattr(experiment, "kind", None) != "sequence":
            hook = getattr(experiment, "tensorboard_images", None)
            if hook is not None:
                for name, state in sweep.member_states(states).items():
                    hook(self.writers[name], name, state, step)
            return
        from mhjax.analysis import runner

        m = experiment.config.model
        tokens = example_tokens(m.seq_len, m.vocab_size)
        sizes = {"vocab_size": m.vocab_size, "max_len": m.seq_len, "width": m.width,
                 "num_layers": m.num_layers, "mlp_dim": m.mlp_dim}
        member_states = sweep.member_states(states)
        for member in experiment.members:
            params = member_states[member.name].params
            attention, combined = example_attention(params, member["heads"], tokens, sizes)
            writer = self.writers[member.name]
            for layer in range(attention.shape[0]):
                writer.add_image(f"attention/layer{layer}", runner.attention_grid(attention[layer], combined[layer]),
                                 step, dataformats="HWC")
            writer.add_image("diffusion/sink_signal", diffusion_image(combined, member.name), step, dataformats="HWC")

    def flush(self) -> None:
        for writer in self.writers.values():
            writer.flush()


# ---------------------------------------------------------------------- #
# Text
# ---------------------------------------------------------------------- #
def config_markdown(config) -> str:
    try:
        body = json.dumps(config.to_dict(), indent=2, default=str)
    except AttributeError:
        body = str(config)
    return "Resolved config:\n\n```json\n" + body + "\n```"


def _hparams_markdown(hparams: dict) -> str:
    return "This member: " + ", ".join(f"`{k}={v}`" for k, v in hparams.items())


# ---------------------------------------------------------------------- #
# HParams plugin protos (the same bytes tensorboard.plugins.hparams.summary_v2 writes)
# ---------------------------------------------------------------------- #
def _add_summary(writer: SummaryWriter, summary, step: int) -> None:
    from tensorboardX.proto.summary_pb2 import Summary

    writer._get_file_writer().add_summary(Summary.FromString(summary.SerializeToString()), step)


def _summary(tag: str, plugin_data):
    from tensorboard.compat.proto import summary_pb2
    from tensorboard.plugins.hparams import metadata

    summary = summary_pb2.Summary()
    summary.value.add(tag=tag, metadata=metadata.create_summary_metadata(plugin_data), tensor=metadata.NULL_TENSOR)
    return summary


def _hparam_value(value):
    """(DataType name, setter) of a hyperparameter value."""
    if isinstance(value, (bool, np.bool_)):
        return "DATA_TYPE_BOOL", lambda v, x: setattr(v, "bool_value", bool(x))
    if isinstance(value, (int, float, np.integer, np.floating)):
        return "DATA_TYPE_FLOAT64", lambda v, x: setattr(v, "number_value", float(x))
    return "DATA_TYPE_STRING", lambda v, x: setattr(v, "string_value", str(x))


def session_start_summary(hparams: dict, group_name: str = "", start_time_secs: float | None = None):
    from tensorboard.plugins.hparams import plugin_data_pb2

    info = plugin_data_pb2.SessionStartInfo(group_name=group_name, start_time_secs=start_time_secs or time.time())
    for name, value in hparams.items():
        _, setter = _hparam_value(value)
        setter(info.hparams[name], value)
    from tensorboard.plugins.hparams import metadata

    return _summary(metadata.SESSION_START_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_start_info=info))


def session_end_summary(status: str = "success", end_time_secs: float | None = None):
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    info = plugin_data_pb2.SessionEndInfo(status=api_pb2.Status.Value(f"STATUS_{status.upper()}"),
                                          end_time_secs=end_time_secs or time.time())
    return _summary(metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=info))


def experiment_summary(experiment, metric_tags: list[str], description: str = ""):
    """Every swept field with its discrete domain over the sweep, and the metric tags."""
    from google.protobuf import struct_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    domains: dict[str, list] = {}
    for member in experiment.members:
        for name, value in member.hparams.items():
            if value not in domains.setdefault(name, []):
                domains[name].append(value)
    infos = []
    for name, values in domains.items():
        kind, setter = _hparam_value(values[0])
        domain = struct_pb2.ListValue()
        for value in sorted(values) if kind != "DATA_TYPE_STRING" else values:
            setter(domain.values.add(), value)
        infos.append(api_pb2.HParamInfo(name=name, display_name=name, type=api_pb2.DataType.Value(kind),
                                        domain_discrete=domain, differs=len(values) > 1))
    metric_infos = [api_pb2.MetricInfo(name=api_pb2.MetricName(tag=tag), display_name=tag,
                                       dataset_type=api_pb2.DATASET_VALIDATION if "eval" in tag or tag.startswith("analysis/")
                                       else api_pb2.DATASET_TRAINING)
                    for tag in dict.fromkeys(metric_tags)]
    exp = api_pb2.Experiment(description=description, time_created_secs=time.time(),
                             hparam_infos=infos, metric_infos=metric_infos)
    return _summary(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=exp))


def final_metrics(records: list[dict], experiment) -> list[str]:
    """Numeric fields of the results records that are metrics (not hyperparameters), in order."""
    swept = set(experiment.members[0].hparams) if experiment.members else set()
    keys: dict[str, None] = {}
    for record in records:
        for key, value in record.items():
            if key in _NOT_METRICS or key in swept or isinstance(value, bool):
                continue
            if isinstance(value, (int, float, np.integer, np.floating)) or (value is None and key in keys):
                keys[key] = None
    return list(keys)


def extra_metric_tags(experiment) -> list[str]:
    """Metric tags filled in later: ``mhjax analyze`` (sequence sweeps) or an experiment's own
    ``metric_tags()``."""
    tags = []
    if getattr(experiment, "kind", None) == "sequence":
        tags.append("analysis/accuracy")
        for layer in range(int(experiment.config.model.num_layers)):
            tags += [f"analysis/layer{layer}/mixing_time", f"analysis/layer{layer}/fidelity_pct"]
    hook = getattr(experiment, "metric_tags", None)
    if hook is not None:
        tags += list(hook())
    return tags


# ---------------------------------------------------------------------- #
# Images
# ---------------------------------------------------------------------- #
def example_tokens(length: int, vocab_size: int, seed: int = EXAMPLE_SEED) -> np.ndarray:
    """The fixed evaluation sequence of the end-of-training images: (1, length) uniform tokens."""
    return np.random.default_rng(seed).integers(0, vocab_size, size=(1, length), dtype=np.int32)


def example_attention(params, heads: int, tokens, sizes: dict) -> tuple[np.ndarray, np.ndarray]:
    """(attention (L, H, T, T), combined operator (L, T, T)) of sequence ``tokens[0]``, eval mode,
    combined with the learned head weights."""
    from mhjax.analysis import runner

    _, attn = runner.predict(params, int(heads), tokens, sizes)
    attention = np.asarray(attn[:, 0], np.float64)
    beta = runner.learned_head_weights(params, int(heads))
    return attention, np.einsum("lh,lhij->lij", beta, attention)


def sink_signal(A: np.ndarray, horizon: int = DIFFUSION_HORIZON) -> np.ndarray:
    """(horizon, T): ``(A^t)[sink, j]`` for t = 1..horizon, the sink being the last node."""
    A = np.asarray(A, np.float64)
    rows = [A[-1]]
    for _ in range(horizon - 1):
        rows.append(rows[-1] @ A)
    return np.stack(rows)


def diffusion_image(combined: np.ndarray, title: str = "", horizon: int = DIFFUSION_HORIZON) -> np.ndarray:
    """RGB uint8 (HWC): per layer, the signal at the sink after t steps from a few source nodes,
    and the minimax fidelity min_j max_t (sink included, as the reference)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    L, T = combined.shape[0], combined.shape[-1]
    sources = sorted({0, T // 4, T // 2, (3 * T) // 4, max(T - 2, 0)})
    fig, axes = plt.subplots(1, L, figsize=(max(3.2 * L, 4.5), 2.8), squeeze=False)
    steps = np.arange(1, horizon + 1)
    for layer, ax in enumerate(axes[0]):
        signal = sink_signal(combined[layer], horizon)
        for j in sources:
            ax.plot(steps, np.maximum(signal[:, j], 1e-6), label=f"from {j}")
        fidelity = signal.max(axis=0).min()
        ax.axhline(max(fidelity, 1e-6), color="k", ls="--", lw=0.8, label=f"minimax {100 * fidelity:.2f}%")
        ax.set(xscale="log", yscale="log", ylim=(1e-4, 1.5), xlabel="steps t", title=f"layer {layer}")
        if layer == 0:
            ax.set_ylabel("signal at sink")
        ax.grid(alpha=0.3)
        ax.legend(fontsize="x-small")
    if title:
        fig.suptitle(f"{title}: diffusion to the sink (combined operator)", fontsize="small")
    fig.tight_layout()
    fig.canvas.draw()
    image = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    plt.close(fig)
    return image
