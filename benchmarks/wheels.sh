#!/usr/bin/env bash
# The wheels folder for a device machine with no network (benchmarks/accelerator.sh and
# benchmarks/reproduce_paper.sh install from it with pip --no-index): the pure-Python
# packages mhjax needs that the device's image lacks, at the versions this environment runs.
#   bash benchmarks/wheels.sh [DIR]        (default .whl, which .gitignore ignores)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
py=${PYTHON:-python3}
pins=$("$py" - <<'PY'
from importlib.metadata import PackageNotFoundError, version
for name in ("ml-collections", "tensorboardX"):
    try:
        print(f"{name}=={version(name)}")
    except PackageNotFoundError:
        print(name)
PY
)
# shellcheck disable=SC2086  # one pin per word
"$py" -m pip download -q --no-deps --only-binary=:all: -d "$dir" $pins
ls -l "$dir"
