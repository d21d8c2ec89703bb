"""Sequence tasks (copy, cycle, zero or any registered task: mhjax.data.tasks) with the causal
Transformer of "Beyond Parallelism: Synergistic Computational Graph Effects in Multi-Head
Attention" (arXiv 2507.02944, Section 4)."""

from __future__ import annotations

import numpy as np

from mhjax.analysis import tags
from mhjax.analysis.metrics import learned_head_weights
from mhjax.config import optional
from mhjax.data import tasks
from mhjax.experiments import (
    architecture,
    optimizer,
    sequence_baselines,
    sequence_programs,
    sequence_results,
    sequence_signals,
    target_range,
    task_params,
)
from mhjax.experiments.base import Experiment
from mhjax.experiments.constants import SequenceConstants
from mhjax.experiments.sequence_config import DEFAULTS, divergence_factor, requested_attention, validate
from mhjax.experiments.sequence_recipe import SequenceRecipe, weighted_mean  # noqa: F401 (their old home)
from mhjax.models.probe import predict
from mhjax.plan import Group, SweepShapes, devices_of
from mhjax.plan.shapes import param_count
from mhjax.train.console import Column, SummaryTable
from mhjax.train.engine import Program
from mhjax.train.members import Member, derive_key, key_names

EXAMPLE_SEED = 0  # the fixed evaluation sequence of the end-of-training images (numpy: no compile)


class SequenceExperiment(Experiment):
    kind = "sequence"
    analyzable = True
    config_defaults = DEFAULTS  # sequence_config.py: the optional fields at their defaults

    def __init__(self, config):
        validate(config)
        self.config = config
        self.members: list[Member] = task_params.members(config)
        self.tasks = task_params.bound_tasks(config)
        # Members differing only in learning rate, a task parameter or architecture share their draws
        # (paired comparison); members of one model shape share programs (experiments/architecture.py).
        shared = ("learning_rate", *architecture.FIELDS)
        self._key_names = key_names(config.sweep, self.members, shared=shared, leading="task")
        self.groups = architecture.shape_groups(config, self.members)
        self.optimizer = optimizer.Settings.from_config(config)
        self.cannot_extend = optimizer.cannot_extend(self.optimizer)

    def regroup(self) -> None:
        self.groups = architecture.shape_groups(self.config, self.members)

    def divergence_factor(self) -> float:
        return divergence_factor(self.config)

    def member_constants(self, member: Member) -> SequenceConstants:
        root, task, index = self.config.seed, member["task"], task_params.task_index(self.tasks, member)
        return SequenceConstants(
            key=derive_key(root, member["seed"], self._key_names[member.name]),
            data_key=derive_key(root, member["seed"], "data", task),
            eval_key=sequence_results.eval_key(root, member["seed"], task, self.tasks[index]),
            task_id=np.int32(index),
            heads=np.int32(member["heads"]),
            learning_rate=np.float32(member["learning_rate"]),
        )

    def layout(self, strategy: str, attention, devices: int) -> list[Program]:
        """Per shape group, ``strategy``'s programs (experiments/sequence_programs.py)."""
        return sequence_programs.programs(self.config, self.members, self.groups, strategy, attention, devices)

    def sweep_shapes(self) -> SweepShapes:
        """Each member's model and head count, its shape groups, and the settings the planner's
        attention path, memory and cost depend on."""
        config, m = self.config, self.config.model
        return SweepShapes(
            models=[architecture.member_model(config, member) for member in self.members],
            heads=[member["heads"] for member in self.members],
            groups=[Group(*g) for g in self.groups],
            batch=config.data.batch_size,
            seq_len=m.seq_len,
            vocab=m.vocab_size,
            dtype=optional(m, "dtype", "float32"),
            dropout=optional(m, "dropout", 0.0),
            attention=requested_attention(config),
        )

    def results_fields(self, backend: str) -> dict:
        dtype = self.config.model.get("dtype", "float32")  # recorded where not the default float32
        return {  # after the plan's attention fields (train/payload.py)
            "optimizer": self.optimizer.recorded(),
            **({"dtype": dtype} if dtype != "float32" else {}),
            **sequence_baselines.baselines(self),  # text: n-gram baselines on the held-out windows
        }

    def eval_steps(self) -> list[int]:
        return [0]  # theta_0's held-out loss starts every curve

    def evaluation_fields(self, index: int, metrics: dict) -> dict:
        return sequence_signals.bits_fields(self, index, metrics)  # text: eval_bits_per_byte

    def learning_rates(self, indices: list[int], first_step: int, length: int):
        return sequence_signals.learning_rates(self, indices, first_step, length)

    def throughput(self, member_steps_per_s: float) -> dict:
        return sequence_signals.throughput(self, member_steps_per_s, devices_of(self.config))

    def result_notes(self, payload: dict) -> list[str]:
        return sequence_baselines.bigram_notes(payload)  # text members not below the bigram

    def notes(self) -> list[str]:
        return task_params.notice(self.config)  # task_params of tasks not in the sweep: ignored

    def metadata(self) -> dict:
        """W/mhjax.json's ``tasks``: where each task came from, so later commands find it again;
        ``data_files``: the files the sweep's data was read from (text: config.data.path), whose
        change refuses a resume (io/metadata.py)."""
        recorded = {"tasks": tasks.sources(self.config.sweep.task, self.tasks)}
        data = {f"task {t.name}": t.source["data"] for t in self.tasks if "data" in t.source}
        return {**recorded, "data_files": data} if data else recorded

    def source_label(self, where: str) -> str:
        return f"task {where.split('.')[-1]!r}"  # metadata()'s "tasks.<name>", in data/tasks.py's words

    def member_info(self, member: Member) -> dict:
        """Static facts for results.json."""
        return {
            "params": param_count(architecture.member_model(self.config, member), member["heads"]),
            **sequence_programs.step_gflop(self.config, member),
        }

    record_model = staticmethod(sequence_results.record_model)  # Run.model without task code
    check_chunk = target_range.check_chunk  # a target outside the vocabulary stops the run

    def extra_results(self, trained, loss_curves) -> dict[int, dict]:
        """Loss and accuracy per position, evaluated at the end of training, and a task's own
        facts (text: bits per byte, the held-out unigram entropy; sequence_results.py)."""
        return sequence_results.by_position(self, trained)

    def summary_table(self) -> SummaryTable:
        columns = (
            Column("train loss", "train_loss"),
            Column("held-out loss", "eval_loss"),
            Column("held-out accuracy", "eval_accuracy", percent=True),
        )
        text = [t.facts["text_format"] for t in self.tasks if "text_format" in t.facts]
        if text:  # bits against the held-out unigram entropy (data/text.py)
            per = "byte" if set(text) == {"bytes"} else "token"
            columns += (
                Column(f"held-out bits/{per}", f"eval_bits_per_{per}"),
                Column("held-out perplexity", "eval_perplexity", fmt="{:.3f}"),
                Column("held-out unigram bits", "heldout_unigram_entropy_bits"),
            )
        if architecture.swept(self.config):  # sizes differ between rows
            columns += (Column("params", "params", fmt="{:,.0f}"), Column("GFLOP/step", "gflop_per_step", fmt="{:.4g}"))
        return SummaryTable(self.swept_fields("task", "heads"), columns)

    def metric_tags(self) -> list[str]:
        return tags.hparams_metrics(int(self.config.model.num_layers))  # logged by `mhjax analyze --workdir W`

    def attention_maps(self, member_states: dict) -> dict:
        """Per member, on one fixed evaluation sequence: every head's attention (L, H, T, T) and
        the combined operator (L, T, T) per layer, drawn by the trainer (plotting/images.py)."""
        m = self.config.model
        tokens = np.random.default_rng(EXAMPLE_SEED).integers(0, m.vocab_size, size=(1, m.seq_len), dtype=np.int32)
        out = {}
        for member in self.members:
            params = member_states[member.name].params
            _, attn = predict(params, member["heads"], tokens)  # sizes read off the member's params
            attention = np.asarray(attn[:, 0], np.float64)  # (L, H, T, T)
            combined = np.einsum("lh,lhij->lij", learned_head_weights(params, member["heads"]), attention)
            out[member.name] = (attention, combined)
        return out
