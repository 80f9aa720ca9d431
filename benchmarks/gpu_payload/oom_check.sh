#!/usr/bin/env bash
# Issue 40, the GPU checks: tests/unit/test_oom_halving.py and test_throughput_report.py (NVML busy share) on a real
# CUDA device (its GPU test: each item takes a third of the free memory, so a batch of 8 and of 4 hit
# torch's own CUDA OutOfMemoryError and halves of 2 fit), plus the rest of the file, with the wheels
# of the payload (.gpu/whl, built by benchmarks/gpu_payload/build.sh; pytest is among them).
#   bash benchmarks/gpu_payload/oom_check.sh              # on the GPU machine; reports -> $OUT
#   PYTHON=.venv/bin/python bash benchmarks/gpu_payload/oom_check.sh   # the same here (GPU test skips)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/e3p-oom-out}
PY=${PYTHON:-python3}
SITE=${E3P_SITE:-/tmp/site-oom}
mkdir -p "$OUT"
started=$(date +%s)
say() { echo "[oom_check $(( $(date +%s) - started ))s] $*" | tee -a "$OUT/steps.txt"; }
if [ ! -f "$SITE/.done" ]; then
  say "install wheels into $SITE"
  rm -rf "$SITE"
  "$PY" -m pip install -q --no-index --no-deps --target "$SITE" .gpu/whl/*.whl >"$OUT/pip.txt" 2>&1 || { say "pip failed"; tail -20 "$OUT/pip.txt"; exit 1; }
  touch "$SITE/.done"
fi
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
"$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')" | tee "$OUT/versions.txt"
say "pytest tests/unit/test_oom_halving.py tests/unit/test_throughput_report.py"
# no conftest (the project's pulls in what the payload does not carry), no ini (its plugins)
timeout -k 10 "${TIMEOUT_S:-120}" "$PY" -m pytest -c /dev/null --rootdir . --noconftest -p no:cacheprovider \
  -v -rs tests/unit/test_oom_halving.py tests/unit/test_throughput_report.py >"$OUT/pytest.txt" 2>&1
rc=$?
say "pytest exited $rc"
tail -25 "$OUT/pytest.txt"
exit $rc
