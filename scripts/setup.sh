#!/usr/bin/env bash
# Create the venv (if missing) and install espnet3-prefect with what the demo and the tests need.
# E3P_VENV names the venv (default .venv); PYTHON the interpreter it is made with (scripts/python.sh);
# E3P_CONSTRAINTS a pip constraints file (CI's lowest-versions tier: .ci/constraints-lowest.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/python.sh
VENV=${E3P_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  echo "+ $PYTHON -m venv $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
constraints=()
if [ -n "${E3P_CONSTRAINTS:-}" ]; then constraints=(-c "$E3P_CONSTRAINTS"); fi
stamp=$VENV/.e3p-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ recipes/dtmf/pyproject.toml -nt "$stamp" ] || [ "$(cat "$stamp")" != "${E3P_CONSTRAINTS:-}" ] \
   || { [ -n "${E3P_CONSTRAINTS:-}" ] && [ "$E3P_CONSTRAINTS" -nt "$stamp" ]; }; then
  echo "+ pip install -e .[test] -e recipes/dtmf ${constraints[*]}" >&2
  editable_install "$VENV/bin/python" -m pip install -q --disable-pip-version-check "${constraints[@]}" -e ".[test]" -e recipes/dtmf 2>&1 \
    | grep -v "is ignored: it is neither" >&2 || true
  "$VENV/bin/python" -c "import espnet3_prefect, dtmf_demo, prefect, prefect_dask, torch" >&2
  echo "${E3P_CONSTRAINTS:-}" >"$stamp"
fi
