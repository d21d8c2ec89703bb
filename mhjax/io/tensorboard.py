"""One TensorBoard run per sweep member at W/tb/<member-name>, written without TensorFlow."""
from __future__ import annotations

import os

from tensorboardX import SummaryWriter


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
