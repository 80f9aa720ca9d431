#!/usr/bin/env bash
# Build the documentation site (docs/: Sphinx + MyST-Parser) as CI does, warnings as errors.
# Installs the `docs` extra into the venv (E3P_VENV, default .venv) first. Output: docs/_build/html,
# or the folder given as the first argument. Intersphinx needs no network (docs/_ext/offline_inventories.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
source scripts/python.sh
VENV=${E3P_VENV:-.venv}
editable_install "$VENV/bin/python" -m pip install -q --disable-pip-version-check -e ".[docs]" 2>&1 \
  | grep -v "is ignored: it is neither" >&2 || true
exec "$VENV/bin/sphinx-build" -W --keep-going -q -b html docs "${1:-docs/_build/html}"
