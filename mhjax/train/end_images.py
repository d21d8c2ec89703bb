"""The end of training's TensorBoard images: every member's attention maps and diffusion to the
sink, and its held-out accuracy by position.

``MHJAX_IMAGES=0`` leaves them out: drawing costs about a second per member on a CPU (matplotlib),
which a sweep of hundreds of members, or a test suite of many tiny runs, may not want. Scalars,
results and checkpoints are the same either way; ``mhjax analyze`` draws its own images."""

from __future__ import annotations

import os

from mhjax.plotting.images import member_images, position_image

ENV = "MHJAX_IMAGES"


def wanted() -> bool:
    """False where ``$MHJAX_IMAGES`` is ``0`` (unset or anything else: drawn)."""
    return os.environ.get(ENV, "1").strip() != "0"


def write(experiment, writers, member_states: dict, step: int, log, records: list[dict]) -> None:
    """Draws and writes the images at ``step``; a failure is one logged line, never a lost run."""
    if not wanted():
        return
    try:
        for name, images in experiment.images(member_states, step).items():
            writers.images(name, images, step)
        for name, (attention, combined) in experiment.attention_maps(member_states).items():
            writers.images(name, member_images(name, attention, combined), step)
        for record in records:  # results per position (an experiment's extra_results) as a line
            if record.get("eval_accuracy_by_position"):
                image = position_image(record["eval_accuracy_by_position"], record["name"])
                writers.images(record["name"], {"eval/accuracy_by_position": image}, step)
        writers.flush()
    except Exception as exc:  # figures must never cost a finished training run
        log(f"tensorboard: end-of-training images skipped ({type(exc).__name__}: {exc})")
