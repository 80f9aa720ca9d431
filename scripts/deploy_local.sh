#!/usr/bin/env bash
# One step to try the deployments: set up .venv, then a local Prefect server (127.0.0.1), the
# process work pool, `prefect deploy --all` and a process worker. Stop with: bash scripts/deploy_local.sh --stop
# Extra arguments go to `espnet3-prefect deploy-local` (e.g. --port 4300).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/espnet3-prefect deploy-local --project-dir "$PWD" "$@"
