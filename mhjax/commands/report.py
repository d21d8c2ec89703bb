"""`mhjax report --workdir W`: W/report.md and its figures (mhjax/workflows/report.py)."""

from __future__ import annotations

import sys

from mhjax.io.lock import WorkdirLock
from mhjax.io.workdir import Workdir
from mhjax.workflows.report import stale_line, write_report
from mhjax.workflows.shards import missing_line


def command(args, overrides) -> int:
    workdir = Workdir(args.workdir)
    with WorkdirLock(workdir, "report"):
        result = write_report(workdir, reference=args.reference, importance_member=args.importance_member)
    count = len(result["figures"])
    print(f"wrote {result['md']} ({count} figure{'' if count == 1 else 's'})")
    missing = missing_line(workdir)
    if missing:
        print(missing, file=sys.stderr)
    stale = result["stale_analysis"]
    if stale:
        print(stale_line(stale["analysis"], stale["results"], args.workdir), file=sys.stderr)
    if result["needs_analysis"]:
        print(
            f"no analysis yet: `mhjax analyze --workdir {args.workdir}` adds mixing time, fidelity and synergy",
            file=sys.stderr,
        )
    return 0
