"""What a whole `mhjax train ... --dry-run --target T` costs beside its compiles (issue 49 item 5),
against a baseline checkout's training chunk compiled alone, in one run, alternated so that
every measurement sees the same load on a shared machine.

Each repeat runs, each in a fresh process (no in-memory cache; the target compile has the
persistent cache off):
- ``base``: the baseline checkout's (--base) training chunk alone, compiled for T by its own
  train/deviceless.compile_for(..., only=("chunk",)) (the chunk's seconds: trace, lower, compile);
- for each checkout in --tree (the first is the one measured; more: e.g. the code before a change)
  and each member count in --members: the whole dry run, its wall time from process start to
  exit, the time before its first "compiling" line, the "compile: X s" it reports and the rest
  (wall - compile: imports, planning, the description, the report).

    python benchmarks/dry_run_cost.py --base /tmp/base_b50 --tree . [--tree /tmp/before]
        [--members 64,512] [--repeats 2] [--json OUT]

Members: the paper config (configs/paper.py, 8 members a seed) with seeds 0..members/8-1.
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
import tempfile
import threading
import time

CHILD = "--child-chunk"  # this script, run inside the baseline checkout: its chunk compile alone


def seeds(members: int) -> str:
    return ",".join(str(s) for s in range(members // 8))


def _cpu(before, after) -> float:
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def base_chunk(tree: str, python: str, members: int, target: str) -> dict:
    """The baseline's training chunk compiled alone for ``target`` (a child process)."""
    env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS="cpu")
    before, load, start = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()[0], time.perf_counter()
    done = subprocess.run(
        [python, os.path.abspath(__file__), CHILD, str(members), target],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
    )
    wall, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise SystemExit(f"{tree}: exit {done.returncode}\n{done.stderr[-2000:]}")
    chunk = json.loads(done.stdout.strip().splitlines()[-1])
    return {**chunk, "process_s": wall, "cpu_s": _cpu(before, after), "load": [load, os.getloadavg()[0]]}


def dry_run(tree: str, python: str, members: int, target: str) -> dict:
    """The whole dry run in ``tree``: wall time, time to the first 'compiling' line, its compile."""
    env = dict(os.environ, PYTHONPATH=tree, JAX_PLATFORMS="cpu")
    before, load = resource.getrusage(resource.RUSAGE_CHILDREN), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as workdir:
        command = [
            python,
            "-m",
            "mhjax",
            "train",
            "--config",
            "configs/paper.py",
            f"--config.sweep.seed={seeds(members)}",
        ]
        command += ["--dry-run", "--target", target, "--workdir", workdir]
        start = time.perf_counter()
        child = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        stdout: list[str] = []
        reader = threading.Thread(target=lambda: stdout.extend(child.stdout), daemon=True)
        reader.start()
        first, stderr = None, []
        for line in child.stderr:
            if first is None and line.startswith("compiling"):
                first = time.perf_counter() - start
            stderr.append(line)
        child.wait()
        reader.join()
        wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    text = "".join(stdout)
    if child.returncode:
        raise SystemExit(f"{tree}: exit {child.returncode}\n{''.join(stderr)[-2000:]}")
    compile_s = float(re.search(r"^compile: ([\d.]+) s", text, re.M).group(1))
    rows = re.findall(r"^  ((?:init|chunk|piece|evaluate)\b.*?)\s+([\d.]+)s ", text, re.M)
    return {
        "wall_s": wall,
        "before_first_compile_s": first,
        "compile_s": compile_s,
        "rest_s": wall - compile_s,
        "executables": {name.strip(): float(s) for name, s in rows},
        "cpu_s": _cpu(before, after),
        "load": [load, os.getloadavg()[0]],
    }


def child_chunk(members: int, target: str) -> None:
    """In the baseline checkout (b50d82e's API): compile its training chunk alone; one JSON line."""
    from mhjax.commands.train import load_config
    from mhjax.experiments import make_experiment
    from mhjax.train import deviceless
    from mhjax.train import target as targets

    config = load_config("configs/paper.py", {"sweep.seed": seeds(members)})
    chosen = targets.load(target)
    report = deviceless.compile_for(make_experiment(config), chosen, log=lambda m: None, only=("chunk",))
    print(json.dumps({"chunk_s": {" ".join(map(str, e.key)): e.seconds for e in report.executables}}))


def main() -> None:
    if sys.argv[1:2] == [CHILD]:
        return child_chunk(int(sys.argv[2]), sys.argv[3])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="baseline checkout: its training chunk compiled alone")
    parser.add_argument("--tree", action="append", required=True, help="checkout whose whole dry run is timed")
    parser.add_argument("--members", default="64,512", help="member counts of the dry runs (8 a seed)")
    parser.add_argument("--base-members", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--target", default="h200")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    counts = [int(n) for n in args.members.split(",")]
    runs: dict[str, list] = {"base": []}
    for i in range(args.repeats):
        result = base_chunk(args.base, args.python, args.base_members, args.target)
        runs["base"].append(result)
        print(f"{i + 1} base chunk alone: {result['chunk_s']}, process {result['process_s']:.1f} s, "
              f"load {result['load'][0]:.1f}-{result['load'][1]:.1f}", flush=True)  # fmt: skip
        for tree in args.tree:
            for n in counts:
                r = dry_run(tree, args.python, n, args.target)
                runs.setdefault(f"{tree} {n}", []).append(r)
                print(f"{i + 1} {tree} {n}: whole {r['wall_s']:.1f} s, first compile at "
                      f"{r['before_first_compile_s']:.1f} s, compile {r['compile_s']:.1f} s, rest {r['rest_s']:.1f} s, "
                      f"{r['executables']}, load {r['load'][0]:.1f}-{r['load'][1]:.1f}", flush=True)  # fmt: skip
    base = statistics.median(sum(r["chunk_s"].values()) for r in runs["base"])
    out = {"date": time.strftime("%Y-%m-%d %H:%M"), "base": args.base, "target": args.target, "runs": runs}
    out["median"] = {"base_chunk_s": base}
    print(f"median base chunk alone: {base:.1f} s")
    for name, rs in runs.items():
        if name == "base":
            continue
        m = {
            k: statistics.median(r[k] for r in rs) for k in ("wall_s", "before_first_compile_s", "compile_s", "rest_s")
        }
        m["ratio_to_base_chunk"] = m["wall_s"] / base
        out["median"][name] = m
        print(f"median {name}: whole {m['wall_s']:.1f} s ({m['ratio_to_base_chunk']:.2f} x base chunk), compile "
              f"{m['compile_s']:.1f} s, rest {m['rest_s']:.1f} s, first compile at "
              f"{m['before_first_compile_s']:.1f} s")  # fmt: skip
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
