#!/usr/bin/env bash
# Create .venv (if missing) and install espnet3-prefect with what the demo and the tests need.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "+ $PYTHON -m venv .venv" >&2
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.e3p-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "+ pip install -e .[test]" >&2
  .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[test]" 2>&1 | grep -v "is ignored: it is neither" >&2 || true
  .venv/bin/python -c "import espnet3_prefect, prefect, prefect_dask, torch" >&2
  touch "$stamp"
fi
