#!/usr/bin/env bash
# All GPUs of one host: the member axis is sharded over every visible device
# (jax.make_mesh over jax.devices()); use a member count divisible by the GPU count.
#   bash launch/all_gpus.sh configs/paper.py runs/paper --config.sweep.seed=0,1,2,3,4,5,6,7
set -euo pipefail
config=${1:?config file}; workdir=${2:?workdir}; shift 2
pip install -q -e ".[cuda]"
export XLA_PYTHON_CLIENT_PREALLOCATE=false
python -c "import jax; print('devices:', jax.devices())"
exec mhjax train --config "$config" --workdir "$workdir" --config.strategy=fused "$@"
