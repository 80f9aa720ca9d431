#!/usr/bin/env bash
# Create (or update) the process work pool the deployments in prefect.yaml use.
# Needs PREFECT_API_URL (a running server). Pool name: $1, default espnet3-local.
set -euo pipefail
cd "$(dirname "$0")/.."
pool=${1:-espnet3-local}
.venv/bin/prefect work-pool create "$pool" --type process --overwrite
# evaluate/checkpoint's queue: one run at a time, taken in the order its checkpoints' events created them
.venv/bin/prefect work-queue create checkpoints --pool "$pool" --limit 1 >/dev/null 2>&1 \
  || .venv/bin/prefect work-queue set-concurrency-limit checkpoints 1 --pool "$pool"
