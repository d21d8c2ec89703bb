"""Write a small text corpus from Python's own documentation: the pydoc text of standard-library
modules, in a fixed order, until the file holds ``--kib`` KiB (the text task's CPU run and its
CI test, docs/text.md).

    python examples/python_docs.py corpus.txt --kib 400

The text depends on the Python version (its docstrings); the run records the file's sha256."""

from __future__ import annotations

import argparse
import importlib
import pydoc

MODULES = (
    "json", "collections", "functools", "itertools", "textwrap", "string", "re", "argparse", "pathlib",
    "random", "statistics", "datetime", "csv", "logging", "shutil", "subprocess", "threading", "heapq",
    "bisect", "decimal", "fractions", "dataclasses", "enum", "typing", "inspect", "os", "io", "zipfile",
)  # fmt: skip


def python_docs(kib: int) -> bytes:
    """The pydoc text of MODULES, concatenated and cut to ``kib`` KiB (all of it if shorter)."""
    out, size = [], 0
    for name in MODULES:
        text = pydoc.render_doc(importlib.import_module(name), renderer=pydoc.plaintext).encode("utf-8")
        out.append(text)
        size += len(text)
        if size >= kib * 1024:
            break
    return b"".join(out)[: kib * 1024]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the file to write")
    parser.add_argument("--kib", type=int, default=400, help="its size in KiB (default 400)")
    args = parser.parse_args()
    data = python_docs(args.kib)
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"wrote {len(data):,} bytes to {args.out}")


if __name__ == "__main__":
    main()
