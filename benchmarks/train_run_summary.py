"""What one `mhjax train` run on a device achieved, as JSON, for benchmarks/accelerator.sh and
benchmarks/reproduce_paper.sh: steps done, compile time and steady member-steps/s apart.

The host loop logs ``perf/member_steps_per_s`` to TensorBoard after every chunk (chunk steps x
members over the chunk's wall time, evaluation and checkpoints excluded). The first chunk's
time includes compiling the training program, so:
  first_chunk_s      = chunk steps x members / the first chunk's rate
  steady             = median rate of the later chunks
  compile_s_estimate = first_chunk_s - chunk steps x members / steady
Where the loop compiles ahead of time and says so ("compiled in X s"), the first chunk holds
no compile and those figures are the compile time (``compile_s_logged``); every log line that
mentions compiling is kept as it is. A run stopped by SIGINT at its time cap still
counts: its TensorBoard files are closed on the way out.

    python benchmarks/train_run_summary.py --workdir W [--log W.log] [--dry-run dry_run.txt]
        [--wall-s S] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mhjax.io.curves import read_run  # noqa: E402

RATE_TAG = "perf/member_steps_per_s"
RATE = re.compile(r"~?([\d,]+(?:\.\d+)?) member-steps/s")
COMPILED = re.compile(r"compiled in ([\d.]+) s")


def summarise(workdir: str, log_text: str = "", dry_run_text: str = "", wall_s: float | None = None) -> dict:
    meta_path = os.path.join(workdir, "mhjax.json")
    if not os.path.isfile(meta_path):
        return {"workdir": workdir, "steps_done": 0, "note": "no mhjax.json: the run never started training"}
    with open(meta_path) as f:
        config = json.load(f)["config"]
    chunk = int(config["train"]["chunk_steps"])
    tb = os.path.join(workdir, "tb")
    names = sorted(os.listdir(tb)) if os.path.isdir(tb) else []
    members = len(names)
    curve = read_run(os.path.join(tb, names[0])) if names else {}  # every member logs the program's rate
    steps, rates = curve.get(RATE_TAG, ((), ()))
    steps, rates = [int(s) for s in steps], [float(r) for r in rates]
    out = {
        "workdir": workdir,
        "members": members,
        "chunk_steps": chunk,
        "steps_target": int(config["train"]["steps"]),
        "steps_done": steps[-1] if steps else 0,
        "member_steps_done": (steps[-1] if steps else 0) * members,
        "rates_per_chunk": rates,
        "attention": config.get("attention"),
        "strategy": config.get("strategy"),
    }
    if rates:
        first_steps = steps[0]  # a chunk may be shorter than chunk_steps at the end only
        out["first_chunk_s"] = first_steps * members / rates[0]
    if len(rates) >= 2:
        steady = statistics.median(rates[1:])
        out["steady_member_steps_per_s"] = steady
        out["compile_s_estimate"] = out["first_chunk_s"] - steps[0] * members / steady
    lines = [line.strip() for line in log_text.splitlines() if "compil" in line.lower()]
    out["compile_log_lines"] = lines[:20]
    logged = [float(m.group(1)) for line in lines for m in [COMPILED.search(line)] if m]
    if logged:  # compiled ahead of time: the first chunk no longer holds the compile
        out["compile_s_logged"] = logged
    for line in dry_run_text.splitlines():  # the cost model's line, in whichever wording
        match = RATE.search(line)
        if match and ("predict" in line or "estimate" in line):
            out["predicted"] = {"member_steps_per_s": float(match.group(1).replace(",", "")), "line": line.strip()}
            break
    if wall_s is not None:
        out["wall_s"] = wall_s
    if os.path.isfile(os.path.join(workdir, "results.json")):
        with open(os.path.join(workdir, "results.json")) as f:
            results = json.load(f)
        out["results_attention"] = results.get("attention")  # the implementation actually used
    out["compile_s"] = compile_seconds(out)
    return out


def compile_seconds(summary: dict) -> float | None:
    """The run's compile time: what it logged when it compiled ahead of time, else the estimate."""
    if summary.get("compile_s_logged"):
        return sum(summary["compile_s_logged"])
    return summary.get("compile_s_estimate")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--log", help="the run's output, for its compile lines")
    parser.add_argument("--dry-run", help="`mhjax train --dry-run` output, for the predicted rate")
    parser.add_argument("--wall-s", type=float, default=None, help="the run's wall time, as measured outside")
    parser.add_argument("--json", help="write here (else stdout)")
    args = parser.parse_args(argv)
    read = lambda path: Path(path).read_text(errors="replace") if path and os.path.isfile(path) else ""
    payload = summarise(args.workdir, read(args.log), read(args.dry_run), args.wall_s)
    text = json.dumps(payload, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    else:
        print(text)
    rate = payload.get("steady_member_steps_per_s")
    compile_s = payload.get("compile_s")
    print(
        f"{payload['steps_done']} steps x {payload.get('members', 0)} members; steady "
        + (f"{rate:,.0f} member-steps/s" if rate else "n/a (fewer than 2 chunks)")
        + (f"; compile ~{compile_s:.1f} s" if compile_s is not None else ""),
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
