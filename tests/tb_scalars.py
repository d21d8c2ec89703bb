"""TensorBoard scalars as a reader sees them, every event kept (io/curves.read_run keeps one value
per step, which would hide a doubled point): for comparing a resumed run with a straight one."""

import os

import numpy as np

WALL_TIME = ("perf/", "final/program_wall_time_s", "final/wall_time_s")  # another run's time, not its numbers


def scalar_events(run_dir: str) -> dict:
    """{tag: [(step, value), ...]} in the order read, after TensorBoard's purges, wall time left out."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(run_dir, size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)]
        for tag in events.Tags()["scalars"]
        if not tag.startswith(WALL_TIME)
    }


def assert_same_scalars(reference: str, workdir: str, names) -> None:
    """Every member's scalars in ``workdir`` are the reference run's: same tags, same steps once each, same values."""
    for name in names:
        want = scalar_events(os.path.join(reference, "tb", name))
        got = scalar_events(os.path.join(workdir, "tb", name))
        assert sorted(got) == sorted(want), (name, sorted(set(got) ^ set(want)))
        for tag in want:
            steps = [s for s, _ in got[tag]]
            assert steps == [s for s, _ in want[tag]], (name, tag, steps)
            np.testing.assert_array_equal([v for _, v in got[tag]], [v for _, v in want[tag]], err_msg=f"{name} {tag}")
