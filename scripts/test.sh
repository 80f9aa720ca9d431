#!/usr/bin/env bash
# Set up and run the whole test suite (unit + real Prefect server + real local Dask clusters).
# Arguments go to pytest, e.g.: bash scripts/test.sh -m "not slow"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q "$@"
