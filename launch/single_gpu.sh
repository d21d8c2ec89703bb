#!/usr/bin/env bash
# One GPU: every member of the sweep on one device.
#   bash launch/single_gpu.sh configs/paper.py runs/paper [--config.FIELD=VALUE ...]
set -euo pipefail
config=${1:?config file}; workdir=${2:?workdir}; shift 2
pip install -q -e ".[cuda]"
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
export XLA_PYTHON_CLIENT_PREALLOCATE=false   # share the card politely; members fit easily
exec mhjax train --config "$config" --workdir "$workdir" "$@"
