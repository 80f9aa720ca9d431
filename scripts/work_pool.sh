#!/usr/bin/env bash
# Create (or update) the process work pool the deployments in prefect.yaml use.
# Needs PREFECT_API_URL (a running server). Pool name: $1, default espnet3-local.
set -euo pipefail
cd "$(dirname "$0")/.."
pool=${1:-espnet3-local}
exec .venv/bin/prefect work-pool create "$pool" --type process --overwrite
