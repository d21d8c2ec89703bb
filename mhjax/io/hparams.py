"""TensorBoard's HParams plugin data for the members' runs (io/tensorboard.py writes them), as
its protos: the same bytes tensorboard.plugins.hparams.summary_v2 writes, without TensorFlow.

* a session start per member (its swept fields) when training starts;
* at the end, the experiment (every hyperparameter with its discrete domain over the sweep and
  every metric tag), whose metrics are the numeric results.json fields that are not
  hyperparameters (``final_metrics``), and each member's session end.
"""

from __future__ import annotations

import time

import numpy as np

from mhjax.io.results import OLD_NAMES

# Fields of a results.json record that are not metrics.
_NOT_METRICS = {
    "name",
    "program",
    "status",
    "steps",
    "params",
    "diverged_at_step",
    "loss_exceeded_at_step",
    "nonfinite_at_step",
    *OLD_NAMES,
}


def add_summary(writer, summary, step: int) -> None:
    """Write ``summary`` (tensorboard's Summary proto) into ``writer``'s (a tensorboardX SummaryWriter) event file."""
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


def uniform_types(hparams: dict[str, dict]) -> dict[str, dict]:
    """{member: fields} with a field whose values differ in type across members (head_dim None
    and 16: "None" and 16) written as text in every member, so its HParams domain has one type."""
    kinds: dict[str, set] = {}
    for values in hparams.values():
        for name, value in values.items():
            kinds.setdefault(name, set()).add(_hparam_value(value)[0])
    mixed = {name for name, k in kinds.items() if len(k) > 1}
    return {m: {k: str(v) if k in mixed else v for k, v in values.items()} for m, values in hparams.items()}


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

    info = plugin_data_pb2.SessionEndInfo(
        status=api_pb2.Status.Value(f"STATUS_{status.upper()}"), end_time_secs=end_time_secs or time.time()
    )
    return _summary(metadata.SESSION_END_INFO_TAG, plugin_data_pb2.HParamsPluginData(session_end_info=info))


def experiment_summary(hparams: dict[str, dict], metric_tags: list[str], description: str = ""):
    """Every swept field with its discrete domain over the sweep, and the metric tags;
    ``hparams``: {member: its swept fields}."""
    from google.protobuf import struct_pb2
    from tensorboard.plugins.hparams import api_pb2, metadata, plugin_data_pb2

    domains: dict[str, list] = {}
    for values in hparams.values():
        for name, value in values.items():
            if value not in domains.setdefault(name, []):
                domains[name].append(value)
    infos = []
    for name, values in domains.items():
        kind, setter = _hparam_value(values[0])
        domain = struct_pb2.ListValue()
        for value in sorted(values) if kind != "DATA_TYPE_STRING" else values:
            setter(domain.values.add(), value)
        infos.append(
            api_pb2.HParamInfo(
                name=name,
                display_name=name,
                type=api_pb2.DataType.Value(kind),
                domain_discrete=domain,
                differs=len(values) > 1,
            )
        )
    metric_infos = [
        api_pb2.MetricInfo(
            name=api_pb2.MetricName(tag=tag),
            display_name=tag,
            dataset_type=api_pb2.DATASET_VALIDATION
            if "eval" in tag or tag.startswith("analysis/")
            else api_pb2.DATASET_TRAINING,
        )
        for tag in dict.fromkeys(metric_tags)
    ]
    exp = api_pb2.Experiment(
        description=description, time_created_secs=time.time(), hparam_infos=infos, metric_infos=metric_infos
    )
    return _summary(metadata.EXPERIMENT_TAG, plugin_data_pb2.HParamsPluginData(experiment=exp))


def final_metrics(records: list[dict], swept: set[str]) -> list[str]:
    """Numeric fields of the results records that are metrics (not the ``swept`` hyperparameters), in order."""
    keys: dict[str, None] = {}
    for record in records:
        for key, value in record.items():
            if key in _NOT_METRICS or key in swept or isinstance(value, bool):
                continue
            if isinstance(value, (int, float, np.integer, np.floating)) or (value is None and key in keys):
                keys[key] = None
    return list(keys)
