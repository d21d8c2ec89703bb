#!/usr/bin/env bash
# A TPU pod slice: the same command on every worker (one process per host); jax.distributed
# auto-detects the slice. The workdir must be shared (e.g. a gs:// bucket mounted or NFS).
#   bash launch/tpu_pod.sh my-tpu us-central2-b configs/paper.py /mnt/shared/runs/paper
set -euo pipefail
tpu=${1:?TPU name}; zone=${2:?zone}; config=${3:?config file}; workdir=${4:?shared workdir}; shift 4
extra="$*"
gcloud compute tpus tpu-vm ssh "$tpu" --zone "$zone" --worker=all --command "
  set -e
  cd ~/mhjax || { echo 'copy the repository to ~/mhjax on every worker first (gcloud compute tpus tpu-vm scp --recurse)'; exit 1; }
  python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[tpu]'
  mhjax train --config $config --workdir $workdir --distributed --no-progress --config.strategy=fused $extra
"
