"""Golden outputs of ``mhjax train --dry-run``: record them, or compare this checkout's with them.

    python tests/golden_dry_run.py record [--targets] [--tpu] [NAME ...]
    python tests/golden_dry_run.py check [--targets] [--tpu] [NAME ...]

Each bundled config's dry run on this machine's CPU (``cpu-CONFIG.txt``), and with ``--targets``
the deviceless compiles for an H200 and an 8-GPU H200 node (``h200-CONFIG.txt``,
``h200x8-CONFIG.txt``), are kept in tests/golden/ with what varies between runs of one checkout
masked (compile and wall times, the machine's core count): a refactor that should change nothing
must leave them identical, and a line that changes is a fix to name. Used by
tests/test_golden_dry_run.py."""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "golden"
CONFIGS = sorted(p.stem for p in (ROOT / "configs").glob("*.py"))
# the target dry runs: the paper's sweep, the quick one, a mixture and a text sweep (each another path)
TARGET_CONFIGS = ("paper", "quick", "mixture", "text")
TARGETS = ("h200", "h200x8")
# with --tpu (libtpu installed: docs/performance.md "Compile targets"), an 8-chip v5e slice
TPU_TARGETS, TPU_CONFIGS = ("v5e-8",), ("paper", "quick")
# what a config needs set to dry-run at all (configs/text.py reads a corpus: the bundled one)
NEEDS = {"text": ["--config.data.path=builtin:stdlib"]}

# What differs between two runs of one checkout: seconds measured (compile, wall), the core count.
MASKS = [
    (re.compile(r"\d[\d,]*\.?\d* ?s\b(?= (?:to compile|compiling|of compile|wall|in all))"), "<T> s"),
    (re.compile(r"(compiled? in|compile(?: time)?:?|wall(?: time)?:?|took) ~?\d[\d,]*\.?\d* ?s\b"), r"\1 <T> s"),
    (re.compile(r"\(\d[\d,]*\.?\d* ?s\)"), "(<T> s)"),
    (re.compile(r"\d+ cores\b"), "<N> cores"),
    (re.compile(r"\d[\d,]*\.?\d* s of wall time"), "<T> s of wall time"),
    (re.compile(r" +(?:\d+(?:\.\d+)?|<T>)s(?= )"), "  <T>s"),  # the compile column of the --target table, its padding
]


def mask(text: str) -> str:
    for pattern, replacement in MASKS:
        text = pattern.sub(replacement, text)
    return text


def runs(targets: bool, names: list[str], tpu: bool = False) -> list[tuple[str, list[str]]]:
    """(golden file name, argv after `mhjax train`) of every dry run asked for."""
    chosen = []
    for config in [] if (targets or tpu) and names else names or CONFIGS:
        chosen.append((f"cpu-{config}.txt", ["--config", f"configs/{config}.py", "--dry-run", *NEEDS.get(config, [])]))
    if targets:
        for config in [c for c in TARGET_CONFIGS if not names or c in names]:
            for target in TARGETS:
                argv = ["--config", f"configs/{config}.py", "--dry-run", "--target", target, *NEEDS.get(config, [])]
                chosen.append((f"{target}-{config}.txt", argv))
    for config in [c for c in TPU_CONFIGS if tpu and (not names or c in names)]:
        for target in TPU_TARGETS:
            chosen.append(
                (f"{target}-{config}.txt", ["--config", f"configs/{config}.py", "--dry-run", "--target", target])
            )
    return chosen


def dry_run(argv: list[str]) -> str:
    """The masked stdout of one dry run, in a fresh process on the CPU with this checkout's code."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [sys.executable, "-m", "mhjax", "train", *argv], cwd=ROOT, env=env, capture_output=True, text=True
    )
    status = f"exit status: {done.returncode}\n"
    if done.returncode != 0:
        status += f"stderr (last line): {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}\n"
    return mask(done.stdout) + status


def compare(name: str, argv: list[str]) -> list[str]:
    """The unified diff of ``name``'s golden file against this checkout's output (empty: identical)."""
    expected = (GOLDEN / name).read_text().splitlines(keepends=True)
    got = dry_run(argv).splitlines(keepends=True)
    return list(difflib.unified_diff(expected, got, f"golden/{name}", f"now/{name}"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=("record", "check"))
    parser.add_argument("--targets", action="store_true", help="also the deviceless h200 and h200x8 compiles")
    parser.add_argument("--tpu", action="store_true", help="also the deviceless v5e-8 compiles (needs libtpu)")
    parser.add_argument("names", nargs="*", help="config names (default: every bundled config)")
    args = parser.parse_intermixed_args(argv)
    GOLDEN.mkdir(exist_ok=True)
    failed = 0
    for name, run_argv in runs(args.targets, args.names, args.tpu):
        if args.action == "record":
            (GOLDEN / name).write_text(dry_run(run_argv))
            print(f"recorded {name}", flush=True)
            continue
        diff = compare(name, run_argv)
        failed += bool(diff)
        print(f"{'DIFFERS' if diff else 'same'}: {name}", flush=True)
        sys.stdout.writelines(diff)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
