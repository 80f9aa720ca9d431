#!/usr/bin/env bash
# Build .gpu/ (ignored; carried to a GPU machine that has python3 3.12 with torch and numpy, and no
# network): the wheels of wheels.txt (what benchmarks.throughput imports beyond torch/numpy: espnet
# 202611 and the part of its dependencies that Speech2Text decoding imports, prefect, prefect-dask,
# dask, distributed, nvidia-ml-py and their needs; found by importing in a bare venv), the stubs,
# the trained mini_an4 model, 150 FSDD recordings, the benchmark and run.sh (dask-cuda's own wheel too,
# for local_gpu.sh: the GPU image has cuda-core, pandas and nvidia-ml-py). About 55 MiB.
#
#   bash benchmarks/gpu_payload/build.sh [RECIPE]   # RECIPE: a trained mini_an4 recipe folder
#                                                   # (default: benchmarks.throughput's cache, trained if absent)
# Then on the GPU machine, from the repository root:  bash .gpu/run.sh   (results under $OUT)
#   or  bash benchmarks/gpu_payload/local_gpu.sh   (env local and local_gpu, the whole test set sorted; ~430 s)
# And the check before, on a CPU, in a bare venv that has torch:
#   DEVICE=cpu PYTHON=/path/to/bare/python E3P_SITE=/tmp/x/site ITEMS="--n-single 6 --n-joined 3" bash .gpu/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
HERE=benchmarks/gpu_payload
G=.gpu
PY=${PYTHON:-.venv-espnet/bin/python}
mkdir -p "$G/whl" "$G/fsdd" "$G/model"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo '/.gpu/' >>.git/info/exclude; }
# antlr4-python3-runtime 4.9.3 (omegaconf's pin) is an sdist on PyPI: built here into a wheel
grep -v '^antlr4-python3-runtime' "$HERE/wheels.txt" >"$G/wheels-binary.txt"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_27_x86_64 \
  --platform manylinux_2_28_x86_64 --platform any -d "$G/whl" -r "$G/wheels-binary.txt"
"$PY" -m pip wheel -q --no-deps -w "$G/whl" "$(grep '^antlr4-python3-runtime' "$HERE/wheels.txt")"
rm -f "$G/wheels-binary.txt"
rm -rf "$G/stubs" && cp -r "$HERE/stubs" "$G/stubs"
cp "$HERE/sitecustomize.py" "$HERE/run.sh" benchmarks/throughput.py "$G/"
ls "${E3P_FSDD:-/work/shared/data/fsdd/recordings}"/*.wav | sort | awk 'NR%4==1' | head -150 | xargs -I{} cp {} "$G/fsdd/"
"$PY" - "${1:-}" <<'EOF'
import sys
from pathlib import Path

from benchmarks.throughput import CACHE, copy_model, trained_recipe

recipe = Path(sys.argv[1]) if sys.argv[1] else trained_recipe(CACHE)
copy_model(recipe, Path(".gpu/model"))
EOF
du -sh "$G"
