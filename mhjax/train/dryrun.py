"""`mhjax train --dry-run`: what a sweep will do, without compiling anything."""
from __future__ import annotations

from mhjax.models import flops


def describe(experiment) -> str:
    config = experiment.config
    lines = [f"experiment: {experiment.kind}, {len(experiment.members)} members, {config.train.steps} steps each"]
    if experiment.kind == "sequence":
        import jax

        m, d = config.model, config.data
        backend = jax.default_backend()
        programs = experiment.programs(config.strategy, backend)
        strategy = config.strategy if config.strategy != "auto" else f"auto ({experiment.auto_strategy(backend)} on {backend})"
        lines.append(f"strategy: {strategy} -> {len(programs)} program(s): " + ", ".join(f"{n} ({len(i)} members)" for n, i, _ in programs))
        lines.append(experiment.strategy_line(backend))
        step_flops = flops.train_step_flops(d.batch_size, m.seq_len, m.width, m.num_layers, m.mlp_dim, m.vocab_size)
        lines.append(f"{'member':<24} {'params':>9} {'GFLOP/step':>11} {'est. memory':>12}")
        total_mem = 0.0
        for member in experiment.members:
            params = experiment.member_info(member)["params"]
            act = flops.activation_bytes(d.batch_size, m.seq_len, m.width, m.num_layers, m.mlp_dim, member["heads"], m.vocab_size)
            mem = 4 * params * 4 + act  # params, grads, Adam m and v in fp32, activations
            total_mem += mem
            lines.append(f"{member.name:<24} {params:>9,} {step_flops / 1e9:>11.3f} {mem / 2**20:>10.1f} MiB")
        total = step_flops * config.train.steps * len(experiment.members)
        lines.append(f"total: {total / 1e12:.2f} TFLOP of training, ~{total_mem / 2**20:.0f} MiB if all members run at once")
    else:
        for member in experiment.members:
            lines.append(f"{member.name:<28} {experiment.member_info(member)}")
    return "\n".join(lines)
