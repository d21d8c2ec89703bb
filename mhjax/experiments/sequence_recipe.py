"""How one member of a sequence program trains (the engine's Recipe): the causal Transformer
of experiments/sequence.py on its task's batches, Adam, held-out evaluation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from mhjax.data import sequences
from mhjax.experiments import optimizer, target_range, task_params
from mhjax.experiments.sequence_config import divergence_factor, scan_layers
from mhjax.models.attention_choice import JAX, AttentionChoice
from mhjax.models.model_config import ModelConfig
from mhjax.train.engine import Recipe


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
    ``attention``: what computes the attention core (models/attention_choice.py). ``model``: the
    program's model (a shape group's, experiments/architecture.py); default config.model's."""

    def __init__(
        self,
        config,
        fine_heads: int,
        *,
        static_heads: bool,
        layout=None,
        attention: AttentionChoice = JAX,
        model: ModelConfig | None = None,
    ):
        m, d = config.model, config.data
        self.model = (model or ModelConfig.from_config(m)).transformer(
            fine_heads,
            layout=layout,
            attention=attention.implementation,
            interpret=attention.interpret,
            scan_layers=scan_layers(config, attention.backend),
        )
        self.static_heads = static_heads
        self.vmap_inside_grad = layout is not None
        self.divergence_factor = divergence_factor(config)
        self.optimizer_settings = optimizer.Settings.from_config(config)
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
        # Adam as the reference, or the LM optimizer config.train asks for (experiments/optimizer.py);
        # the learning rate lives in the state so it can be vmapped.
        return optimizer.make(self.optimizer_settings, consts.learning_rate)

    def _data_keys(self, consts):
        data = consts.data_key
        return {
            "dataset": jax.random.fold_in(data, 0),
            "shuffle": jax.random.fold_in(data, 1),
            "fresh": jax.random.fold_in(data, 2),
        }

    def _batch(self, consts, step):
        return sequences.train_batch(
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

    def prefetch(self, consts, first_step, length):
        """The batches of a chunk's steps, drawn at once (the same keys, so the same batches), when
        a task reads the host (text above its on-device limit): one read per chunk, its
        (length, batch, T) inputs, targets and weights held for the chunk. None (every other
        task): each step draws its own batch."""
        if not any(task.host_reads for task in self.tasks):
            return None
        return jax.vmap(lambda step: tuple(self._batch(consts, step)))(first_step + jnp.arange(length))

    def loss(self, params, consts, step, data=None):
        tokens, targets, weights = self._batch(consts, step) if data is None else data
        dropout_key = jax.random.fold_in(jax.random.fold_in(consts.key, 1), step)
        logits = self.model.apply(
            {"params": params}, tokens, self._heads(consts), deterministic=False, rngs={"dropout": dropout_key}
        )
        loss = weighted_mean(optax.softmax_cross_entropy_with_integer_labels(logits, targets), weights)
        return loss, target_range.target_range(targets, weights, self.vocab)  # checked by check_chunk

    def evaluate(self, params, consts, step):
        """Held-out loss and token accuracy of theta_step in eval mode (no dropout), in batches of
        eval_batch windows, over all num_eval of them: where num_eval is a multiple of the batch, the
        mean of the batches' weighted means (exact when weights are uniform); else the last batch is
        padded with windows of weight 0 and the result is the weighted mean over every token."""
        batch = sequences.eval_batch(
            consts.eval_key, consts.task_id, self.num_eval, self.length, self.vocab, self.tasks
        )
        pad = -self.num_eval % self.eval_batch
        if pad:
            batch = [jnp.concatenate([a, jnp.zeros((pad, *a.shape[1:]), a.dtype)]) for a in batch]
        shape = (-1, self.eval_batch, self.length)
        batch = jax.tree_util.tree_map(lambda a: a.reshape(shape), tuple(batch))

        def one(batch):
            x, y, w = batch
            logits = self.model.apply({"params": params}, x, self._heads(consts))
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, y)
            correct = (jnp.argmax(logits, -1) == y).astype(jnp.float32)
            if pad:
                return jnp.sum(loss * w), jnp.sum(correct * w), jnp.sum(w)
            return weighted_mean(loss, w), weighted_mean(correct, w)

        if pad:
            losses, correct, weights = jax.lax.map(one, batch)
            total = jnp.maximum(weights.sum(), jnp.finfo(jnp.float32).tiny)
            return {"eval_loss": losses.sum() / total, "eval_accuracy": correct.sum() / total}
        # Equal-sized batches: the mean of their weighted means (exact when weights are uniform).
        losses, accs = jax.lax.map(one, batch)
        return {"eval_loss": losses.mean(), "eval_accuracy": accs.mean()}
