#!/usr/bin/env bash
# The demo on the embedded default: a local Prefect server (127.0.0.1) + a local Dask cluster.
# Generates DTMF audio, decodes it with a small torch model, writes exp/dtmf/inference/<test>/hyp.scp.
# Extra arguments go to the CLI, e.g.: bash scripts/demo.sh parallel.n_workers=1 --keep-server
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m dtmf_demo.recipe --data-root exp/dtmf/data >/dev/null
exec .venv/bin/espnet3-prefect infer --config recipes/dtmf/conf/inference.yaml "$@"
