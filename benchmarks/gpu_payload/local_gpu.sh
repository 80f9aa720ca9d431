#!/usr/bin/env bash
# Issue 40 on the GPU, the whole test set sorted (docs/benchmarks.md, "2026-11-28, morning: ... on one
# H200"): (1) env local, one worker that sees the GPU: upstream batches 4/16, duration batching at their
# budgets, the bare loop; (2) env local_gpu (dask-cuda carried as its own wheel; the GPU image has
# cuda-core, pandas and nvidia-ml-py): duration at the batch-16 budget and upstream 16. Built into .gpu/
# by build.sh; run as  bash benchmarks/gpu_payload/local_gpu.sh  (carry .gpu; ~430 s on an H200).
# The check before, on a CPU: DEVICE=cpu PYTHON=.venv/bin/python ITEMS="--n-single 6 --n-joined 3" ...
set -uo pipefail
cd "$(dirname "$0")/../.."  # the repository root, where .gpu/ is
OUT=${OUT:-/tmp/e3p-gpu-out}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}; DEVICE=${DEVICE:-cuda}
SITE=${E3P_SITE:-/tmp/site}; SRC=${E3P_SRC:-/tmp/e3p-src}; WORK=${E3P_GPU_WORK:-/tmp/e3p-gpu-work}
ITEMS=${ITEMS:---n-single 120 --n-joined 40}
REPO=$PWD; started=$(date +%s)
say() { echo "[local_gpu.sh $(( $(date +%s) - started ))s] $*" | tee -a "$OUT/steps.txt"; }
rm -rf "$SRC" "$WORK" "$SITE"
say "install wheels"
"$PY" -m pip install -q --no-index --no-deps --target "$SITE" .gpu/whl/*.whl >"$OUT/pip.txt" 2>&1 || { say "pip failed"; tail -20 "$OUT/pip.txt"; exit 1; }
cp .gpu/sitecustomize.py "$SITE/"
mkdir -p "$SRC/benchmarks"
cp -r espnet3_prefect "$SRC/" && cp -r flows "$SRC/espnet3_prefect/flows" && cp -r tasks "$SRC/espnet3_prefect/tasks"
cp benchmarks/__init__.py benchmarks/gpu_batch.py benchmarks/audio.py "$SRC/benchmarks/"
cp .gpu/throughput.py "$SRC/benchmarks/throughput.py"
export PYTHONPATH="$SITE:$REPO/.gpu/stubs:$SRC" PYTHONUNBUFFERED=1 E3P_FSDD="$REPO/.gpu/fsdd" PATH="$SITE/bin:$PATH"
cd "$SRC"
(nvidia-smi || true) >"$OUT/nvidia-smi.txt" 2>&1
"$PY" -c "import torch, numpy, prefect, dask, espnet2; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'prefect', prefect.__version__, 'dask', dask.__version__)" 2>&1 | tail -1 | tee "$OUT/versions.txt"
common=(--device "$DEVICE" --workers 1 --shards 2 --model-dir "$REPO/.gpu/model" --fsdd "$REPO/.gpu/fsdd")
say "local: 5 runs"
# shellcheck disable=SC2086
timeout -k 10 "${LOCAL_TIMEOUT_S:-330}" "$PY" -m benchmarks.throughput "${common[@]}" $ITEMS --work "$WORK/local" \
  --budget-s "${LOCAL_BUDGET_S:-250}" --runs duration_b16budget upstream_b16 bare duration_b4budget upstream_b4 \
  --json "$OUT/local.json" >"$OUT/local_log.txt" 2>&1
say "local exited $?"
grep -E "^run |^(upstream|duration|bare)" "$OUT/local_log.txt" | tail -8
say "local_gpu: 2 runs"
"$PY" -c "import dask_cuda; print('dask_cuda', dask_cuda.__version__)" 2>&1 | tail -1 | tee -a "$OUT/versions.txt"
# shellcheck disable=SC2086
timeout -k 10 "${GPU_TIMEOUT_S:-170}" "$PY" -m benchmarks.throughput "${common[@]}" --env local_gpu $ITEMS \
  --work "$WORK/local_gpu" --budget-s 90 --runs duration_b16budget upstream_b16 \
  --json "$OUT/local_gpu.json" >"$OUT/local_gpu_log.txt" 2>&1
say "local_gpu exited $?"
grep -E "^run |^(upstream|duration|bare)" "$OUT/local_gpu_log.txt" | tail -4
grep -E "Error|error:" "$OUT/local_gpu_log.txt" | head -5
