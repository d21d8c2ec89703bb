"""Compile time of `mhjax train ... --dry-run --target T` in two checkouts, alternated (A, B, A,
B, ...) so that both see the same load on a shared machine; medians and their ratio B / A.
Each run is a fresh process (no in-memory cache; the target compile has the persistent cache
off). Reports the command's own "compile: X s" (wall) and the process's CPU seconds.

    python benchmarks/target_compile.py --a /path/to/base --b /path/to/new [--repeats 3]
        [--python PY] [--json OUT] -- --config configs/paper.py --config.sweep.seed=0,1,2,3,4,5,6,7
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time


def run(tree: str, python: str, extra: list[str], target: str) -> dict:
    """One dry run for ``target`` with ``tree`` as the mhjax checkout."""
    env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS="cpu")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [python, "-m", "mhjax", "train", *extra, "--dry-run", "--target", target],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{tree}: exit {done.returncode}\n{done.stderr[-2000:]}")
    compile_s = float(re.search(r"^compile: ([\d.]+) s", done.stdout, re.M).group(1))
    rows = re.findall(r"^  ((?:init|chunk|piece|evaluate)\b.*?)\s+([\d.]+)s ", done.stdout, re.M)
    return {
        "compile_s": compile_s,
        "cpu_s": (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime),
        "process_s": wall,
        "executables": {name.strip(): float(s) for name, s in rows},
        "load_average": os.getloadavg()[0],
    }


def main() -> None:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", required=True, help="baseline checkout")
    parser.add_argument("--b", required=True, help="checkout measured against it")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--target", default="h200")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv[: argv.index("--")] if "--" in argv else argv)
    runs = {"a": [], "b": []}
    for i in range(args.repeats):
        for side in ("a", "b"):
            result = run(getattr(args, side), args.python, extra, args.target)
            runs[side].append(result)
            print(f"{i + 1} {side}: compile {result['compile_s']:.1f} s, cpu {result['cpu_s']:.1f} s, "
                  f"{result['executables']}, load {result['load_average']:.1f}", flush=True)  # fmt: skip
    out = {
        "command": "mhjax train " + " ".join(extra) + f" --dry-run --target {args.target}",
        "a": args.a,
        "b": args.b,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "runs": runs,
    }
    for key in ("compile_s", "cpu_s"):
        a, b = (statistics.median(r[key] for r in runs[s]) for s in ("a", "b"))
        out[f"median_{key}"] = {"a": a, "b": b, "ratio": b / a}
        print(f"median {key}: a {a:.1f}, b {b:.1f}, ratio b/a {b / a:.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
