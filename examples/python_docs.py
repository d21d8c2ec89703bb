"""Write a small text corpus from Python's own documentation: the pydoc text of standard-library
modules, in a fixed order, until the file holds ``--kib`` KiB (the text task's CPU run and its
CI test, docs/text.md); or, with ``--stdlib``, the standard library's sources that
``config.data.path=builtin:stdlib`` reads (mhjax/data/python_corpora.py).

    python examples/python_docs.py corpus.txt --kib 400
    python examples/python_docs.py stdlib.txt --stdlib

The text depends on the Python version (its docstrings; pydoc prints some default values with
their memory address, so two runs can differ in a few bytes); the run records the file's sha256."""

from __future__ import annotations

import argparse
import hashlib

from mhjax.data.python_corpora import python_docs, stdlib_sources


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", help="the file to write")
    parser.add_argument("--kib", type=int, default=400, help="its size in KiB (default 400)")
    parser.add_argument("--stdlib", action="store_true", help="the standard library's sources instead (builtin:stdlib)")
    args = parser.parse_args()
    data = stdlib_sources()[0] if args.stdlib else python_docs(args.kib)
    with open(args.out, "wb") as f:
        f.write(data)
    print(f"wrote {len(data):,} bytes to {args.out}, sha256 {hashlib.sha256(data).hexdigest()}")


if __name__ == "__main__":
    main()
