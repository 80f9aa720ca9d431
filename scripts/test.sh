#!/usr/bin/env bash
# Set up and run the whole test suite (unit + real Prefect server + real local Dask clusters).
# Arguments go to pytest, e.g. the quick part (collection, unit tests, doctests): bash scripts/test.sh -m "not slow"
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${E3P_VENV:-.venv}/bin/python" -m pytest -q "$@"
