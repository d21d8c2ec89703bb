"""What the entry points do, once: the command line (mhjax/commands/, argparse adapters) and the
Python API (mhjax/api/) both call these functions.

    configs.py       load_config (a file or a bundled name, overrides, validation), bundled_configs
    workdir.py       open_workdir -> Opened: a trained workdir's files; its tasks and experiment on demand
    train.py         train (lock, library logs, the trainer), describe (--dry-run), default_workdir
    analyze.py       analyze_workdir, analyze_torch_checkpoint, write_analysis
    report.py        write_report
    reproduction.py  reproduction_markdown (report --reference)
    example2.py      run_example2, format_example2
"""
