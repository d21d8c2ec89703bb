"""Byte corpora built from the running Python, so a text run needs no download:

* ``builtin:stdlib`` (``config.data.path``): the standard library's Python sources. Every
  ``*.py`` file under ``sysconfig.get_paths()["stdlib"]``, skipping any folder named in
  ``STDLIB_SKIP`` (installed packages, the test suites, bytecode), in ascending order of the
  path relative to that folder ("/"-separated), their bytes concatenated as they are. Written
  once to ``<cache_root>/corpora/stdlib-<implementation>-<version>-<sha256[:16]>.txt``
  (mhjax/cache_dir.py): named by its content, so Pythons sharing the folder never overwrite
  each other's. data/text.py reads it as any byte file and records the name, the Python and the
  file's sha256 (mhjax.json, results.json).
* ``python_docs(kib)``: the pydoc text of some modules (examples/python_docs.py writes it to a
  file). Not a built-in: pydoc prints some default values with their memory address, so its
  bytes can differ between runs.

Both depend on the Python version; the sha256 says which bytes a run saw."""

from __future__ import annotations

import hashlib
import importlib
import itertools
import os
import platform
import pydoc
import sysconfig
import tempfile

from mhjax.cache_dir import cache_root
from mhjax.config import ConfigError

PREFIX = "builtin:"
STDLIB_SKIP = frozenset({"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"})

DOC_MODULES = (
    "json", "collections", "functools", "itertools", "textwrap", "string", "re", "argparse", "pathlib",
    "random", "statistics", "datetime", "csv", "logging", "shutil", "subprocess", "threading", "heapq",
    "bisect", "decimal", "fractions", "dataclasses", "enum", "typing", "inspect", "os", "io", "zipfile",
)  # fmt: skip


def stdlib_files(root: str | None = None) -> list[str]:
    """The ``*.py`` files of the standard library (``root``: its folder, default the running
    Python's), as sorted "/"-separated paths relative to ``root``, folders in STDLIB_SKIP skipped."""
    root = sysconfig.get_paths()["stdlib"] if root is None else root
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in STDLIB_SKIP]
        rel = os.path.relpath(folder, root)
        out += [name if rel == "." else f"{rel}/{name}".replace(os.sep, "/") for name in files if name.endswith(".py")]
    return sorted(out)


def stdlib_sources(root: str | None = None) -> tuple[bytes, dict]:
    """The bytes of stdlib_files(root), concatenated, and what is recorded of them (the corpus
    name, the Python, the folder, the number of files)."""
    root = sysconfig.get_paths()["stdlib"] if root is None else root
    files = stdlib_files(root)
    chunks = []
    for rel in files:
        with open(os.path.join(root, *rel.split("/")), "rb") as f:
            chunks.append(f.read())
    about = {
        "builtin": "stdlib",
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "stdlib": os.path.abspath(root),
        "files": len(files),
    }
    return b"".join(chunks), about


def stdlib_file_starts(root: str | None = None) -> list[int]:
    """Where each of stdlib_files(root) starts in stdlib_sources(root)'s bytes (the clusters of the
    held-out windows' standard errors: data/heldout_split.py)."""
    root = sysconfig.get_paths()["stdlib"] if root is None else root
    sizes = [os.path.getsize(os.path.join(root, *rel.split("/"))) for rel in stdlib_files(root)]
    return [0, *itertools.accumulate(sizes[:-1])] if sizes else []


BUILDERS = {"stdlib": stdlib_sources}  # builtin:NAME -> a builder of (bytes, record)
FILE_STARTS = {"stdlib": stdlib_file_starts}  # builtin:NAME -> where its source files start
_BUILT: dict[str, tuple[str, dict]] = {}  # name -> (cache file, record): built once per process
_STARTS: dict[str, list[int]] = {}  # name -> file_starts


def corpus_dir() -> str:
    """Where built-in corpora are written: ``corpora/`` in mhjax's cache folder."""
    return os.path.join(cache_root(), "corpora")


def is_builtin(path) -> bool:
    return isinstance(path, str) and path.startswith(PREFIX)


def resolve(path: str) -> tuple[str, dict]:
    """``builtin:NAME`` as (its cache file, what mhjax.json records of it besides the file), the
    file built and written if missing; an unknown NAME is a one-line ConfigError naming the allowed names."""
    name = path[len(PREFIX) :]
    if name not in BUILDERS:
        allowed = ", ".join(PREFIX + n for n in sorted(BUILDERS))
        raise ConfigError(f"config.data.path: unknown built-in corpus {path!r}; allowed: {allowed}")
    if name not in _BUILT:
        data, about = BUILDERS[name]()
        sha = hashlib.sha256(data).hexdigest()
        stem = f"{name}-{about['python_implementation'].lower()}-{about['python']}-{sha[:16]}"
        _BUILT[name] = (_write_once(os.path.join(corpus_dir(), stem + ".txt"), data), about)
    return _BUILT[name]


def file_starts(path: str) -> list[int] | None:
    """``builtin:NAME``'s file offsets (ascending), or None for a corpus without a file list."""
    name = path[len(PREFIX) :] if is_builtin(path) else None
    if name not in FILE_STARTS:
        return None
    if name not in _STARTS:  # a walk of the stdlib: once per process
        _STARTS[name] = FILE_STARTS[name]()
    return _STARTS[name]


def _write_once(path: str, data: bytes) -> str:
    """``path`` holding ``data``: written atomically (a temporary file renamed) unless already there."""
    if os.path.isfile(path) and os.path.getsize(path) == len(data):
        return path  # named by its content's sha256: the same bytes
    folder = os.path.dirname(path)
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".building-")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except OSError as exc:
        raise ConfigError(
            f"config.data.path: cannot write the built-in corpus to {folder} ({exc.strerror or exc}); "
            f"set $MHJAX_CACHE_DIR to a writable folder"
        ) from None
    return path


def python_docs(kib: int) -> bytes:
    """The pydoc text of DOC_MODULES, concatenated and cut to ``kib`` KiB (all of it if shorter)."""
    out, size = [], 0
    for name in DOC_MODULES:
        text = pydoc.render_doc(importlib.import_module(name), renderer=pydoc.plaintext).encode("utf-8")
        out.append(text)
        size += len(text)
        if size >= kib * 1024:
            break
    return b"".join(out)[: kib * 1024]
