"""Sequence tasks (copy, cycle, zero or any registered task: mhjax.data.tasks) with the causal
Transformer of "Beyond Parallelism: Synergistic Computational Graph Effects in Multi-Head
Attention" (arXiv 2507.02944, Section 4)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from mhjax.analysis import tags
from mhjax.analysis.metrics import learned_head_weights
from mhjax.data import tasks
from mhjax.experiments import (
    architecture,
    optimizer,
    path_memory,
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
from mhjax.models import cost, cost_devices, count_params
from mhjax.models.attention_choice import AUTO, KERNELS, AttentionChoice, resolve_attention
from mhjax.models.probe import predict
from mhjax.train.console import Column, SummaryTable
from mhjax.train.engine import Program, recipe_groups
from mhjax.train.members import Member, derive_key, key_names

UNROLL_MIN_STEPS, UNROLL_MAX_MEMBERS = 2000, 16  # when `auto` unrolls on a CPU
EXAMPLE_SEED = 0  # the fixed evaluation sequence of the end-of-training images (numpy: no compile)


class SequenceExperiment(Experiment):
    kind = "sequence"
    analyzable = True
    config_defaults = DEFAULTS  # sequence_config.py: the optional fields at their defaults

    def __init__(self, config):
        validate(config)
        self.config = config
        self._kernel_failed: dict[str, str] = {}  # {backend: why}, after kernel_fallback
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

    def programs(self, strategy: str, backend: str) -> list[Program]:
        """The compiled programs of the sweep under ``strategy``: per shape group, the
        strategy's programs (experiments/sequence_programs.py); auto: see auto_strategy."""
        if strategy == "auto":
            strategy = self.auto_strategy(backend)
        choice = self.attention(backend)
        path_memory.check(self, choice, choice.core(self._traced(strategy)), self._devices())
        return sequence_programs.programs(self.config, self.members, self.groups, strategy, choice, self._devices())

    def _traced(self, strategy: str) -> bool:
        """Whether ``strategy`` traces head counts (fused over several in one shape group)."""
        return strategy == "fused" and any(len({self.members[i]["heads"] for i in g.members}) > 1 for g in self.groups)

    def attention(self, backend: str) -> AttentionChoice:
        """What config.attention runs on ``backend`` (this process's or a target's), and why;
        after the kernel failed to compile there (kernel_fallback), auto's JAX path."""
        m = self.config.model
        models = [(architecture.member_model(self.config, x), x["heads"]) for x in self.members]
        shapes = {(model.attention_width or model.width, heads) for model, heads in models}  # the TPU kernel's
        itemsize = 2 if m.get("dtype", "float32") == "bfloat16" else 4  # VMEM need (models/tpu_vmem.py)
        requested = requested_attention(self.config)
        choice = resolve_attention(requested, backend, m.seq_len, m.get("dropout", 0.0), shapes, itemsize)
        failed = self._kernel_failed.get(choice.backend)
        if failed and choice.requested == AUTO and choice.implementation in KERNELS:
            reason = f"auto on {choice.backend}: JAX (the Pallas kernel failed to compile)"
            return dataclasses.replace(choice, implementation="jax", interpret=False, fallback=failed, reason=reason)
        return choice

    def kernel_fallback(self, backend: str, reason: str) -> bool:
        choice = self.attention(backend)
        if choice.requested != AUTO or choice.implementation not in KERNELS:
            return False
        self._kernel_failed[choice.backend] = f"the Pallas kernel failed to compile: {reason}"
        return True

    def attention_used(self, backend: str) -> str:
        """What computes the attention core of this sweep's programs: ``fused`` over several
        head counts traces them (AttentionChoice.core)."""
        return self.attention(backend).core(traced_heads=self._traced(self.resolved_strategy(backend)))

    def resolved_strategy(self, backend: str, devices: int | None = None) -> str:
        """config.strategy, with ``auto`` resolved for ``backend`` (auto_strategy)."""
        return self.auto_strategy(backend, devices) if self.config.strategy == "auto" else self.config.strategy

    def results_fields(self, backend: str) -> dict:
        fallback = self.attention(backend).fallback
        dtype = self.config.model.get("dtype", "float32")  # recorded where not the default float32
        return {
            "attention": self.attention_used(backend),
            **({"attention_fallback": fallback} if fallback else {}),
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
        return sequence_signals.throughput(self, member_steps_per_s, self._devices())

    def result_notes(self, payload: dict) -> list[str]:
        return sequence_baselines.bigram_notes(payload)  # text members not below the bigram

    def _kernel_priced(self, backend: str) -> bool | str:
        """Whether the cost model prices static head counts at a Pallas kernel's cost (True: the
        GPU's, "tpu": the TPU's): on a CPU it predicts for an H200, so for what a GPU would run."""
        choice = requested_attention(self.config)
        if choice == "cpu_kernel":
            return False
        target = "gpu" if backend == "cpu" else backend
        implementation = resolve_attention(choice, target, self.config.model.seq_len).implementation
        return {"pallas": True, "pallas_tpu": "tpu"}.get(implementation, False)

    def auto_strategy(self, backend: str, devices: int | None = None) -> str:
        """On a CPU: unrolled for long runs of few members on one device, else fused. Paper
        model on 2 cores (benchmarks/RESULTS.md): unrolled steps 12-20 % faster than fused,
        but compiles ~20 s longer per member; a short run would lose the difference.
        Elsewhere: the strategy the cost model (models/cost.py) predicts fastest; over several
        devices each device runs its shard of one_program's groups (models/member_layout.py).
        Ties go to the fewest programs (fused, then one_program, then grouped). ``devices``:
        default, the planned ones (a target's, ``planned_devices``) or this machine's
        (config.devices caps them)."""
        devices = devices or self._devices()
        if backend == "cpu":
            long_run = self.config.train.steps >= UNROLL_MIN_STEPS and len(self.members) <= UNROLL_MAX_MEMBERS
            return "unrolled" if long_run and devices == 1 else "fused"
        candidates = ("fused", "one_program", "grouped")
        choice = self.attention(backend)  # a strategy whose JAX path would not fit is no candidate
        fitting = [s for s in candidates if path_memory.fits(self, choice, choice.core(self._traced(s)), devices)]
        candidates = tuple(fitting) or candidates  # none fits: programs() says so in one line
        rate = {s: self.predict(s, backend, devices)["member_steps_per_s"] for s in candidates}
        return max(candidates, key=rate.__getitem__)  # max keeps the first of equals

    def _devices(self) -> int:
        """Devices the member axis is sharded over: a compile target's (``planned_devices``), else
        this machine's (config.devices caps them; 0 = all)."""
        if self.planned_devices:
            return self.planned_devices
        count = int(self.config.get("devices", 0) or 0)
        return min(count, jax.device_count()) if count else jax.device_count()

    @staticmethod
    def program_groups(programs: list[Program]) -> list[list[tuple[int, int, bool]]]:
        """Per program, its groups as (members, fine heads, mixed): what models/cost.py prices."""
        out = []
        for program in programs:
            groups = []
            for size, recipe in recipe_groups(program):
                if recipe.model.layout is not None:  # attention at each group's own head count
                    groups += [(n, h, False) for n, h in recipe.model.layout]
                else:
                    groups.append((size, recipe.model.num_heads, not recipe.static_heads))
            out.append(groups)
        return out

    def predict(self, strategy: str, backend: str, devices: int | None = None, dtype: str | None = None) -> dict:
        """models/cost.sweep_cost of ``strategy`` on ``backend``'s device preset (an H200
        for backends without one) over ``devices`` of them (default: this machine's), in
        ``dtype`` (default: config.model.dtype)."""
        return self.price(self.programs(strategy, backend), backend, devices, dtype)

    def price(
        self, programs: list[Program], backend: str, devices: int | None = None, dtype: str | None = None
    ) -> dict:
        """models/cost.sweep_cost of ``programs``, each at its own model's shape."""
        device = cost.DEVICES[cost.BACKEND_DEVICE.get(backend, "h200")]
        devices = devices or self._devices()
        dtype = dtype or self.config.model.get("dtype", "float32")
        scanned = any(recipe.model.scan_layers for p in programs for _, recipe in recipe_groups(p))
        kernel, groups = self._kernel_priced(backend), self.program_groups(programs)
        shapes = []
        for p in programs:
            t = recipe_groups(p)[0][1].model
            sizes = (t.width, t.num_layers, t.mlp_dim, t.vocab_size, t.attention_width)
            shapes.append(cost.Shape(self.config.data.batch_size, self.config.model.seq_len, *sizes))
        return {"device": device, **cost.sweep_cost(shapes, groups, device, devices, kernel, scanned, dtype)}

    def step_seconds(self, program: Program, backend: str) -> float:
        """models/cost.py's seconds per step of ``program`` alone on one ``backend`` device."""
        return len(program.members) / self.price([program], backend, devices=1)["member_steps_per_s"]

    def estimated_bytes_per_member_step(self, backend: str, devices: int) -> float:  # the compiled program's
        p = self.predict(self.resolved_strategy(backend, devices), backend, devices)
        return p["compiled_bytes_per_member_step"]

    def estimated_dot_flops_per_member_step(self, backend: str, devices: int) -> float:
        return self.predict(self.resolved_strategy(backend, devices), backend, devices)["dot_flops_per_member_step"]

    def estimate_lines(self, backend: str) -> list[str]:
        """The dry run's cost lines: the estimate (in config.model.dtype), over N devices beside one
        device's (models/cost_devices.py), and the same sweep in the other dtype."""
        lines = self._estimate_lines(backend)
        dtype = self.config.model.get("dtype", "float32")
        target = backend if backend in cost.BACKEND_DEVICE else "gpu"
        devices = self._devices() if backend in cost.BACKEND_DEVICE else 1
        strategy = self.resolved_strategy(target, devices)
        if devices > 1:
            p, one = self.predict(strategy, target, devices), self.predict(strategy, target, 1)
            lines += cost_devices.lines(p, one, p["device"].name)
        other = "float32" if dtype == "bfloat16" else "bfloat16"
        p = self.predict(strategy, target, devices, other)
        if dtype == "bfloat16":
            lines.append(
                "  model.dtype=bfloat16: priced in bfloat16 (models/cost_dtype.py: activations and the kernels' rows "
                "and weights at 2 bytes, dots at the bfloat16 rate)"
            )
        lines.append(
            f"  in {other}: ~{p['member_steps_per_s']:,.0f} member-steps/s, "
            f"{p['compiled_bytes_per_member_step'] / 1e9:.2f} GB compiled per member-step"
            + ("" if other == "float32" else " (--config.model.dtype=bfloat16)")
        )
        return lines

    def _estimate_lines(self, backend: str) -> list[str]:
        """An estimate for this machine where models/cost.py has a preset for its backend; else a
        prediction for one H200, labelled as such."""
        work = self.config.train.steps * len(self.members)
        if backend in cost.BACKEND_DEVICE:
            devices = self._devices()
            p = self.predict(self.resolved_strategy(backend), backend, devices)
            machine = "the target" if self.planned_devices else "this machine"  # train/deviceless.py's
            where = f"{machine} ({devices} x {backend}, priced as {devices} x {p['device'].name})"
            return [f"estimate for {where}, roofline of models/cost.py: " + cost.prediction_text(p, work)]
        backends = {}
        for b, d in sorted(cost.BACKEND_DEVICE.items()):
            backends.setdefault(cost.DEVICES[d].name, []).append(b)
        presets = " and ".join(f"{'/'.join(b)} ({name})" for name, b in backends.items())
        strategy = self.resolved_strategy("gpu", 1)
        p = self.predict(strategy, "gpu", 1)
        return [
            f"estimate for this machine ({backend}): none (models/cost.py has presets for {presets})",
            f"accelerator prediction, not this machine: on one {p['device'].name} this sweep would run "
            f"{strategy} (roofline of models/cost.py): " + cost.prediction_text(p, work),
        ]

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
        model = architecture.member_model(self.config, member).transformer(member["heads"])
        return {
            "params": _param_count(model, self.config.model.seq_len),
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

    def describe(self, backend: str) -> list[str]:
        """Programs (by shape group), and per member: parameters, analytic FLOPs per step and
        estimated memory (experiments/sequence_programs.py)."""
        config = self.config
        programs = self.programs(config.strategy, backend)
        strategy = (
            config.strategy if config.strategy != "auto" else f"auto ({self.resolved_strategy(backend)} on {backend})"
        )
        return [
            f"strategy: {strategy} -> {len(programs)} program(s): "
            + ", ".join(f"{p.name} ({len(p.members)} members)" for p in programs),
            *sequence_programs.group_lines(self, programs, backend),
            *self.estimate_lines(backend),
            f"attention: {self.attention_used(backend)} (config.attention={requested_attention(config)} on {backend})"
            + (f"; {self.attention(backend).fallback}" if self.attention(backend).fallback else ""),
            *path_memory.lines(self, self.attention_used(backend)),
            *sequence_programs.member_lines(self, self.attention_used(backend)),
        ]


_PARAM_COUNTS: dict[tuple[str, int], int] = {}  # (the module's repr: every attribute, T) -> count


def _param_count(model, seq_len: int) -> int:
    """The model's parameter count, traced once per distinct module: the dry run asks for every
    member and attention path (hundreds of calls, a few distinct shapes; ~0.5 s a trace)."""
    key = (repr(model), seq_len)
    if key not in _PARAM_COUNTS:
        shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, seq_len), jnp.int32)))
        _PARAM_COUNTS[key] = count_params(shapes["params"])
    return _PARAM_COUNTS[key]
