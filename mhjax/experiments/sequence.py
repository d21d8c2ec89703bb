"""Sequence tasks (copy, cycle, zero or any registered task: mhjax.data.tasks) with the causal
Transformer of "Beyond Parallelism: Synergistic Computational Graph Effects in Multi-Head
Attention" (arXiv 2507.02944, Section 4)."""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mhjax.analysis import tags
from mhjax.analysis.metrics import learned_head_weights
from mhjax.data import sequences, tasks
from mhjax.experiments import sequence_results, target_range, task_params
from mhjax.experiments.base import Experiment
from mhjax.experiments.constants import SequenceConstants
from mhjax.experiments.sequence_config import divergence_factor, requested_attention, scan_layers, validate
from mhjax.models import cost, count_params, flops
from mhjax.models.attention_choice import AUTO, JAX, AttentionChoice, resolve_attention
from mhjax.models.model_config import ModelConfig
from mhjax.models.probe import config_sizes, predict
from mhjax.train.console import Column, SummaryTable
from mhjax.train.engine import Program, Recipe, Unrolled, recipe_groups
from mhjax.train.members import Member, derive_key, key_names

UNROLL_MIN_STEPS, UNROLL_MAX_MEMBERS = 2000, 16  # when `auto` unrolls on a CPU
EXAMPLE_SEED = 0  # the fixed evaluation sequence of the end-of-training images (numpy: no compile)


def weighted_mean(values, weights):
    """sum(values * weights) / sum(weights), written as mean / mean so that all-one weights
    give exactly ``values.mean()`` (copy, cycle and zero keep their numbers)."""
    return jnp.mean(values * weights) / jnp.maximum(jnp.mean(weights), jnp.finfo(jnp.float32).tiny)


class SequenceRecipe(Recipe):
    """How one member of a program trains: the model at ``fine_heads`` heads (static); with
    ``static_heads=False`` the program mixes head counts and a member's own head count is a
    traced constant (fine heads summed per coarse head, models/attention.py). With a
    ``layout`` (the program's (members, heads) groups) the vmapped model runs each group's
    attention at its static head count, and the engine takes gradients outside the vmap.
    ``attention``: what computes the attention core (models/attention_choice.py)."""

    def __init__(self, config, fine_heads: int, *, static_heads: bool, layout=None, attention: AttentionChoice = JAX):
        m, d = config.model, config.data
        self.model = ModelConfig.from_config(m).transformer(
            fine_heads,
            layout=layout,
            attention=attention.implementation,
            interpret=attention.interpret,
            scan_layers=scan_layers(config, attention.backend),
        )
        self.static_heads = static_heads
        self.vmap_inside_grad = layout is not None
        self.divergence_factor = divergence_factor(config)
        self.protocol, self.num_train, self.batch_size = d.protocol, d.num_train, d.batch_size
        self.num_eval, self.eval_batch = d.num_eval, min(d.num_eval, d.batch_size)
        self.length, self.vocab = m.seq_len, m.vocab_size
        self.tasks = task_params.bound_tasks(config)  # a member's task_id indexes these

    def _heads(self, consts):
        return None if self.static_heads else consts.heads

    def init_params(self, consts):
        dummy = jnp.zeros((1, self.length), jnp.int32)
        return self.model.init(jax.random.fold_in(consts.key, 0), dummy)["params"]

    def optimizer(self, consts):
        # Adam as the reference (beta 0.9/0.999, eps 1e-8); lr lives in the state so it can be vmapped.
        return optax.inject_hyperparams(optax.adam)(learning_rate=consts.learning_rate)

    def _data_keys(self, consts):
        data = consts.data_key
        return {
            "dataset": jax.random.fold_in(data, 0),
            "shuffle": jax.random.fold_in(data, 1),
            "fresh": jax.random.fold_in(data, 2),
        }

    def loss(self, params, consts, step):
        tokens, targets, weights = sequences.train_batch(
            self._data_keys(consts),
            consts.task_id,
            step,
            protocol=self.protocol,
            num_train=self.num_train,
            batch_size=self.batch_size,
            length=self.length,
            vocab_size=self.vocab,
            tasks=self.tasks,
        )
        dropout_key = jax.random.fold_in(jax.random.fold_in(consts.key, 1), step)
        logits = self.model.apply(
            {"params": params}, tokens, self._heads(consts), deterministic=False, rngs={"dropout": dropout_key}
        )
        loss = weighted_mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets), weights)
        return loss, target_range.target_range(targets, weights, self.vocab)  # checked by check_chunk

    def evaluate(self, params, consts, step):
        """Held-out loss and token accuracy of theta_step in eval mode (no dropout), in batches."""
        batch = sequences.eval_batch(
            consts.eval_key, consts.task_id, self.num_eval, self.length, self.vocab, self.tasks
        )
        usable = (self.num_eval // self.eval_batch) * self.eval_batch
        shape = (-1, self.eval_batch, self.length)
        batch = jax.tree_util.tree_map(lambda a: a[:usable].reshape(shape), tuple(batch))

        def one(batch):
            x, y, w = batch
            logits = self.model.apply({"params": params}, x, self._heads(consts))
            loss = weighted_mean(optax.softmax_cross_entropy_with_integer_labels(logits, y), w)
            return loss, weighted_mean((jnp.argmax(logits, -1) == y).astype(jnp.float32), w)

        # Equal-sized batches: the mean of their weighted means (exact when weights are uniform).
        losses, accs = jax.lax.map(one, batch)
        return {"eval_loss": losses.mean(), "eval_accuracy": accs.mean()}


class SequenceExperiment(Experiment):
    kind = "sequence"
    analyzable = True

    def __init__(self, config):
        validate(config)
        self.config = config
        self._kernel_failed: dict[str, str] = {}  # {backend: why}, after kernel_fallback
        self.members: list[Member] = task_params.members(config)
        self.tasks = task_params.bound_tasks(config)
        # Members differing only in learning rate or a task parameter share their draws (paired comparison).
        self._key_names = key_names(config.sweep, self.members, shared=("learning_rate",), leading="task")

    def divergence_factor(self) -> float:
        return divergence_factor(self.config)

    def member_constants(self, member: Member) -> SequenceConstants:
        root, task = self.config.seed, member["task"]
        return SequenceConstants(
            key=derive_key(root, member["seed"], self._key_names[member.name]),
            data_key=derive_key(root, member["seed"], "data", task),
            eval_key=derive_key(root, member["seed"], "eval", task),
            task_id=np.int32(task_params.task_index(self.tasks, member)),
            heads=np.int32(member["heads"]),
            learning_rate=np.float32(member["learning_rate"]),
        )

    def programs(self, strategy: str, backend: str) -> list[Program]:
        """The compiled programs of the sweep under ``strategy``.

        unrolled: one program, every member written out unbatched at its own static head count
          (engine.Unrolled): on a CPU, XLA runs them concurrently on the cores, each with
          unbatched matmuls;
        fused: one vmapped program at the finest head count (members' head counts traced);
        grouped: one vmapped program per head count;
        one_program: fused's single vmapped program with members listed head count by head
          count, whose attention runs group by group at static head counts (the model's
          ``layout``): grouped's cost, one copy of the model to compile;
        auto: see auto_strategy.
        """
        if strategy == "auto":
            strategy = self.auto_strategy(backend)
        heads = [m["heads"] for m in self.members]
        attention = self.attention(backend)
        if strategy == "unrolled":
            recipes = {h: SequenceRecipe(self.config, h, static_heads=True, attention=attention) for h in set(heads)}
            return [Program("all", list(range(len(self.members))), Unrolled([recipes[h] for h in heads]))]
        finest = math.lcm(*heads)  # divides the width: every head count does
        if strategy == "one_program":
            # Only the attention core is per head count; the rest of the model, the optimiser
            # and the data are one vmapped copy (an Unrolled group per head count compiled the
            # whole step once per group: ~1 minute for the 64-member paper sweep on 2 cores).
            groups = self._by_heads()
            layout = tuple((len(idx), h) for h, idx in groups.items())
            order = [i for idx in groups.values() for i in idx]
            return [
                Program(
                    "all",
                    order,
                    SequenceRecipe(self.config, finest, static_heads=False, layout=layout, attention=attention),
                )
            ]
        if strategy == "fused":
            static = len(set(heads)) == 1
            recipe = SequenceRecipe(self.config, finest, static_heads=static, attention=attention)
            return [Program("all", list(range(len(self.members))), recipe)]
        return [
            Program(f"h{h}", idx, SequenceRecipe(self.config, h, static_heads=True, attention=attention))
            for h, idx in self._by_heads().items()
        ]

    def attention(self, backend: str) -> AttentionChoice:
        """What config.attention runs on ``backend`` (this process's or a target's), and why;
        after the kernel failed to compile there (kernel_fallback), auto's JAX path."""
        choice = resolve_attention(requested_attention(self.config), backend, self.config.model.seq_len)
        failed = self._kernel_failed.get(choice.backend)
        if failed and choice.requested == AUTO and choice.implementation == "pallas":
            reason = f"auto on {choice.backend}: JAX (the Pallas kernel failed to compile)"
            return dataclasses.replace(choice, implementation="jax", interpret=False, fallback=failed, reason=reason)
        return choice

    def kernel_fallback(self, backend: str, reason: str) -> bool:
        choice = self.attention(backend)
        if choice.requested != AUTO or choice.implementation != "pallas":
            return False
        self._kernel_failed[choice.backend] = f"the Pallas kernel failed to compile: {reason}"
        return True

    def attention_used(self, backend: str) -> str:
        """What computes the attention core of this sweep's programs: ``fused`` over several
        head counts traces them (AttentionChoice.core)."""
        mixed = self.resolved_strategy(backend) == "fused" and len({m["heads"] for m in self.members}) > 1
        return self.attention(backend).core(traced_heads=mixed)

    def resolved_strategy(self, backend: str, devices: int | None = None) -> str:
        """config.strategy, with ``auto`` resolved for ``backend`` (auto_strategy)."""
        return self.auto_strategy(backend, devices) if self.config.strategy == "auto" else self.config.strategy

    def results_fields(self, backend: str) -> dict:
        fallback = self.attention(backend).fallback
        return {"attention": self.attention_used(backend), **({"attention_fallback": fallback} if fallback else {})}

    def _kernel_priced(self, backend: str) -> bool:
        """Whether the cost model prices static head counts at the Pallas kernel's cost: on a
        CPU it predicts for an H200, so for what a GPU would run."""
        choice = requested_attention(self.config)
        if choice == "cpu_kernel":
            return False
        target = "gpu" if backend == "cpu" else backend
        return resolve_attention(choice, target, self.config.model.seq_len).implementation == "pallas"

    def _by_heads(self) -> dict[int, list[int]]:
        """{head count: member indices}, head counts ascending, indices in member order."""
        groups = {}
        for i, m in enumerate(self.members):
            groups.setdefault(m["heads"], []).append(i)
        return dict(sorted(groups.items()))

    def auto_strategy(self, backend: str, devices: int | None = None) -> str:
        """On a CPU: unrolled for long runs of few members on one device, else fused. Paper
        model on 2 cores (benchmarks/RESULTS.md): unrolled steps 12-20 % faster than fused,
        but compiles ~20 s longer per member; a short run would lose the difference.
        Elsewhere: the strategy the cost model (models/cost.py) predicts fastest. With
        several devices only vmapped programs (fused, grouped), whose member axis shards
        evenly; one_program's groups would slice a sharded axis. Ties go to the fewest
        programs (fused, then one_program, then grouped). ``devices``: default, this
        machine's (config.devices caps them)."""
        devices = devices or self._devices()
        if backend == "cpu":
            long_run = self.config.train.steps >= UNROLL_MIN_STEPS and len(self.members) <= UNROLL_MAX_MEMBERS
            return "unrolled" if long_run and devices == 1 else "fused"
        candidates = ("fused", "one_program", "grouped") if devices == 1 else ("fused", "grouped")
        rate = {s: self.predict(s, backend, devices)["member_steps_per_s"] for s in candidates}
        return max(candidates, key=rate.__getitem__)  # max keeps the first of equals

    def _devices(self) -> int:
        """Devices the member axis is sharded over (config.devices caps them; 0 = all)."""
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

    def predict(self, strategy: str, backend: str, devices: int | None = None) -> dict:
        """models/cost.sweep_cost of ``strategy`` on ``backend``'s device preset (an H200
        for backends without one) over ``devices`` of them (default: this machine's)."""
        device = cost.DEVICES[cost.BACKEND_DEVICE.get(backend, "h200")]
        programs, devices = self.programs(strategy, backend), devices or self._devices()
        scanned = any(recipe.model.scan_layers for p in programs for _, recipe in recipe_groups(p))
        kernel, groups = self._kernel_priced(backend), self.program_groups(programs)
        return {
            "device": device,
            **cost.sweep_cost(cost.Shape.of(self.config), groups, device, devices, kernel, scanned),
        }

    def estimated_bytes_per_member_step(self, backend: str, devices: int) -> float:  # the compiled program's
        p = self.predict(self.resolved_strategy(backend, devices), backend, devices)
        return p["compiled_bytes_per_member_step"]

    def estimate_lines(self, backend: str) -> list[str]:
        """The dry run's cost lines: an estimate for this machine where models/cost.py has a
        preset for its backend; else a prediction for one H200, labelled as such."""
        work = self.config.train.steps * len(self.members)
        if backend in cost.BACKEND_DEVICE:
            devices = self._devices()
            p = self.predict(self.resolved_strategy(backend), backend, devices)
            where = f"this machine ({devices} x {backend}, priced as {devices} x {p['device'].name})"
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
        """W/mhjax.json's ``tasks``: where each task came from, so later commands find it again."""
        return {"tasks": tasks.sources(self.config.sweep.task)}

    def member_info(self, member: Member) -> dict:
        """Static facts for results.json."""
        m = self.config.model
        model = ModelConfig.from_config(m).transformer(member["heads"])
        shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, m.seq_len), jnp.int32)))
        return {"params": count_params(shapes["params"])}

    record_model = staticmethod(sequence_results.record_model)  # Run.model without task code
    check_chunk = target_range.check_chunk  # a target outside the vocabulary stops the run

    def extra_results(self, trained, loss_curves) -> dict[int, dict]:
        """Loss and accuracy per position, evaluated at the end of training (sequence_results.py)."""
        return sequence_results.by_position(self, trained)

    def summary_table(self) -> SummaryTable:
        return SummaryTable(
            self.swept_fields("task", "heads"),
            (
                Column("train loss", "train_loss"),
                Column("held-out loss", "eval_loss"),
                Column("held-out accuracy", "eval_accuracy", percent=True),
            ),
        )

    def metric_tags(self) -> list[str]:
        return tags.hparams_metrics(int(self.config.model.num_layers))  # logged by `mhjax analyze --workdir W`

    def attention_maps(self, member_states: dict) -> dict:
        """Per member, on one fixed evaluation sequence: every head's attention (L, H, T, T) and
        the combined operator (L, T, T) per layer, drawn by the trainer (plotting/images.py)."""
        m = self.config.model
        tokens = np.random.default_rng(EXAMPLE_SEED).integers(0, m.vocab_size, size=(1, m.seq_len), dtype=np.int32)
        sizes = config_sizes(m)
        out = {}
        for member in self.members:
            params = member_states[member.name].params
            _, attn = predict(params, member["heads"], tokens, sizes)
            attention = np.asarray(attn[:, 0], np.float64)  # (L, H, T, T)
            combined = np.einsum("lh,lhij->lij", learned_head_weights(params, member["heads"]), attention)
            out[member.name] = (attention, combined)
        return out

    def describe(self, backend: str) -> list[str]:
        """Programs, and per member: parameters, analytic FLOPs per step and estimated memory."""
        config = self.config
        m, d = config.model, config.data
        programs = self.programs(config.strategy, backend)
        strategy = (
            config.strategy if config.strategy != "auto" else f"auto ({self.resolved_strategy(backend)} on {backend})"
        )
        lines = [
            f"strategy: {strategy} -> {len(programs)} program(s): "
            + ", ".join(f"{p.name} ({len(p.members)} members)" for p in programs),
            *self.estimate_lines(backend),
            f"attention: {self.attention_used(backend)} (config.attention={requested_attention(config)} on {backend})",
        ]
        step_flops = flops.train_step_flops(d.batch_size, m.seq_len, m.width, m.num_layers, m.mlp_dim, m.vocab_size)
        lines.append(f"{'member':<24} {'params':>9} {'GFLOP/step':>11} {'est. memory':>12}")
        total_mem = 0.0
        for member in self.members:
            params = self.member_info(member)["params"]
            act = flops.activation_bytes(
                d.batch_size, m.seq_len, m.width, m.num_layers, m.mlp_dim, member["heads"], m.vocab_size
            )
            mem = 4 * params * 4 + act  # params, grads, Adam m and v in fp32, activations
            total_mem += mem
            lines.append(f"{member.name:<24} {params:>9,} {step_flops / 1e9:>11.3f} {mem / 2**20:>10.1f} MiB")
        total = step_flops * config.train.steps * len(self.members)
        lines.append(
            f"total: {total / 1e12:.2f} TFLOP of training, ~{total_mem / 2**20:.0f} MiB if all members run at once"
        )
        return lines
