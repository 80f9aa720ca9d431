#!/usr/bin/env bash
# Issue 40, the GPU run: the mini_an4 Speech2Text model (trained one step, .gpu/model) on real audio
# (FSDD recordings and joins of them, .gpu/fsdd) through our infer flow, parallel.env local with one
# worker that sees the GPU (not local_gpu: dask-cuda needs pandas, cuda-core and rapids-dask-dependency,
# too large for the payload), upstream batching (4, 16), duration batching at the same budgets, and a
# bare Speech2Text loop over the same sorted batches; NVML busy share sampled. JSON and logs -> $OUT.
#   bash .gpu/run.sh                         # on the GPU machine (python3 with torch + numpy)
#   DEVICE=cpu PYTHON=/path/python bash .gpu/run.sh   # the same on a CPU (the check before)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/e3p-gpu-out}
PY=${PYTHON:-python3}
DEVICE=${DEVICE:-cuda}
SITE=${E3P_SITE:-/tmp/site}
SRC=${E3P_SRC:-/tmp/e3p-src}
WORK=${E3P_GPU_WORK:-/tmp/e3p-gpu-work}
ITEMS=${ITEMS:---n-single 160 --n-joined 60}
BUDGET_S=${BUDGET_S:-180}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)
REPO=$PWD
started=$(date +%s)
say() { echo "[run.sh $(( $(date +%s) - started ))s] $*" | tee -a "$OUT/steps.txt"; }

rm -rf "$SRC" "$WORK"
if [ "${E3P_KEEP_SITE:-0}" = 1 ] && [ -f "$SITE/sitecustomize.py" ]; then
  say "wheels: keeping $SITE"
else
  say "install wheels into $SITE"
  rm -rf "$SITE"
  if [ "${E3P_NO_PIP:-0}" != 1 ] && "$PY" -m pip --version >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --target "$SITE" .gpu/whl/*.whl >"$OUT/pip.txt" 2>&1 || { say "pip failed"; tail -20 "$OUT/pip.txt"; exit 1; }
  else  # no pip for this python: a wheel is a zip; unpack each, and write the one console script used (prefect)
    say "no pip: unpacking the wheels"
    "$PY" - "$SITE" .gpu/whl/*.whl <<'UNPACK' || { say "unpacking failed"; exit 1; }
import os, shutil, sys, zipfile
site, wheels = sys.argv[1], sys.argv[2:]
os.makedirs(os.path.join(site, "bin"), exist_ok=True)
for wheel in wheels:
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
for name in os.listdir(site):
    if name.endswith(".data"):
        for kind in ("purelib", "platlib"):
            inner = os.path.join(site, name, kind)
            if os.path.isdir(inner):
                shutil.copytree(inner, site, dirs_exist_ok=True)
launcher = os.path.join(site, "bin", "prefect")
with open(launcher, "w") as handle:
    handle.write(f"#!{sys.executable}\nimport sys\nfrom prefect.cli import app\nsys.exit(app())\n")
os.chmod(launcher, 0o755)
UNPACK
  fi
fi
cp .gpu/sitecustomize.py "$SITE/"
mkdir -p "$SRC/benchmarks"
cp -r espnet3_prefect "$SRC/" && cp -r flows "$SRC/espnet3_prefect/flows" && cp -r tasks "$SRC/espnet3_prefect/tasks"
cp benchmarks/__init__.py benchmarks/gpu_batch.py benchmarks/audio.py "$SRC/benchmarks/"
cp .gpu/throughput.py "$SRC/benchmarks/throughput.py"
export PYTHONPATH="$SITE:$REPO/.gpu/stubs:$SRC"
export PYTHONUNBUFFERED=1 E3P_FSDD="$REPO/.gpu/fsdd" PATH="$SITE/bin:$PATH"  # the prefect command (server)
cd "$SRC"  # python -m puts the current folder first: the copies here, not the working tree's benchmarks/
(nvidia-smi || true) >"$OUT/nvidia-smi.txt" 2>&1
"$PY" -c "import torch, numpy, prefect, dask, espnet2, torchaudio; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'numpy', numpy.__version__, 'prefect', prefect.__version__, 'dask', dask.__version__, 'torchaudio', torchaudio.__version__)" 2>&1 | tail -1 | tee "$OUT/versions.txt"
say "benchmark (device $DEVICE, items: $ITEMS, no run starts after ${BUDGET_S}s)"
# shellcheck disable=SC2086
timeout -k 15 "${TIMEOUT_S:-300}" "$PY" -m benchmarks.throughput --device "$DEVICE" --workers 1 --shards 2 $ITEMS \
  --model-dir "$REPO/.gpu/model" --fsdd "$REPO/.gpu/fsdd" --work "$WORK" --budget-s "$BUDGET_S" \
  --runs duration_b16budget upstream_b16 bare upstream_b4 duration_b4budget \
  --json "$OUT/throughput.json" >"$OUT/log.txt" 2>&1
rc=$?
say "benchmark exited $rc"
grep -v "WARNING\|decoding may be\| INFO \|RuntimeWarning" "$OUT/log.txt" | tail -40
exit $rc
