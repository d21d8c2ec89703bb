"""Writing a sweep's results: W/results.json (atomically), its Markdown table W/results.md and the
members' per-window held-out losses W/eval_windows (io/window_files.py), for a Workdir."""

from __future__ import annotations

import os

from mhjax.io import parts, window_files
from mhjax.io.results import WriteFailed, json_ready, kept_results, markdown_table, write_json, write_text


def write(workdir, payload: dict, tables=None, summary=None) -> dict:
    """results.json, results.md (``tables(payload, workdir)``'s Markdown after the members, when given) and
    W/eval_windows (taken out of ``payload``); ``summary(payload, workdir)``: top-level fields computed
    once the windows are written (the ``comparisons``); returns what they hold: a part's payload merged with
    the other parts' entries (io/parts.merge), else ``payload``."""
    if workdir.order is not None:
        stored = workdir.results() if os.path.isfile(workdir.results_path) else None
        payload = parts.merge(stored, payload, workdir.folder, workdir.order, workdir.program_names)
    try:
        window_files.save(workdir.file(window_files.FOLDER), payload)
        if summary is not None:
            payload.update(summary(payload, workdir))
        members = [{k: json_ready(v) for k, v in m.items()} for m in payload["members"]]
        # unless results.json and results.md both say it already (io/results.kept_results)
        if kept := kept_results(
            workdir.results_path, workdir.file(workdir.RESULTS_TABLE), {**payload, "members": members}
        ):
            return kept
        write_json(workdir.results_path, {**payload, "members": members})
        table = markdown_table(members, payload.get("title", "Results"))
        more = tables({**payload, "members": members}, workdir) if tables else ""
        tuned = any(e.get("selected") for e in payload.get("comparisons") or [])  # compare.tune: its table first
        head, _, rest = table.partition("\n\n")  # "# title", then the members' table
        text = (f"{head}\n\n{more}\n{rest}" if tuned else f"{table}\n{more}") if more else table
        write_text(workdir.file(workdir.RESULTS_TABLE), text)
    except WriteFailed as exc:
        exc.hint = "; training is done and checkpointed: free some space and run the same command to write it"
        raise
    return payload
