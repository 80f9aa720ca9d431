#!/usr/bin/env bash
# Build .venv-parity: espnet3-prefect (editable, with its test extra) plus the real ESPnet3 code
# from PyPI's espnet wheel, so the parity tests (tests/parity, `pytest -m parity`) can run
# upstream infer()/measure() beside ours.
#
# Only the espnet3/ and espnet2/ folders of the wheel are used (unzipped into
# .venv-parity/espnet-src/ and put on sys.path by a .pth file), with the few packages upstream
# infer()/measure() and the esp2_asr WER/CER metrics import. The wheel's own dependency set is
# not installed: its DataOrganizer needs torchaudio, which does not load with torch 2.13; the
# parity recipes bring their own organizers.
#
# Idempotent: a stamp file makes a re-run a few stat calls. PYTHON picks the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
ESPNET_VERSION=${E3P_ESPNET_VERSION:-202611}
PYTHON=${PYTHON:-python3}
VENV=.venv-parity
SRC="$PWD/$VENV/espnet-src"
stamp="$VENV/.parity-espnet-$ESPNET_VERSION"
started=$(date +%s)

if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] && [ ! scripts/parity_setup.sh -nt "$stamp" ] \
   && [ "$(cat "$stamp")" = "$SRC" ]; then
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "+ $PYTHON -m venv $VENV" >&2
  "$PYTHON" -m venv "$VENV"
fi
py="$VENV/bin/python"

# torch is pinned to the version the project's own venv uses: any other one is a multi-GB download.
constraints="$VENV/constraints.txt"
echo "torch==2.13.0" >"$constraints"

echo "+ pip install -e .[test] + what upstream infer()/measure() import" >&2
# What the wheel's code imports on the infer()/measure() path, beyond our own dependencies:
#   typeguard (espnet3.parallel.parallel, espnet2.text.cleaner), tqdm (espnet3.parallel.base_runner),
#   soundfile (espnet3.utils.writer_utils), jiwer (esp2_asr metrics; also in our test extra).
# (humanfriendly is imported only by espnet2's training and frontend modules, not on this path;
# dask-jobqueue, which espnet3.parallel.parallel needs to see Dask at all, is in our test extra.)
"$py" -m pip install -q --disable-pip-version-check -c "$constraints" -e ".[test]" -e recipes/dtmf \
  typeguard tqdm soundfile jiwer 2>&1 | grep -v "is ignored: it is neither" >&2 || true

wheel_dir="$VENV/wheels"
mkdir -p "$wheel_dir"
wheel=$(ls "$wheel_dir"/espnet-"$ESPNET_VERSION"-*.whl 2>/dev/null | head -n1 || true)
if [ -z "$wheel" ]; then
  echo "+ pip download espnet==$ESPNET_VERSION (wheel only, no dependencies)" >&2
  "$py" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.12 "espnet==$ESPNET_VERSION" -d "$wheel_dir" 2>&1 \
    | grep -v "is ignored: it is neither" >&2 || true
  wheel=$(ls "$wheel_dir"/espnet-"$ESPNET_VERSION"-*.whl 2>/dev/null | head -n1 || true)
  if [ -z "$wheel" ]; then
    echo "parity_setup: could not download the espnet==$ESPNET_VERSION wheel" >&2
    exit 1
  fi
fi

echo "+ unzip espnet3/ espnet2/ from $(basename "$wheel") into $SRC" >&2
rm -rf "$SRC"
"$py" - "$wheel" "$SRC" <<'EOF'
import sys, zipfile
wheel, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as zf:
    members = [m for m in zf.namelist() if m.startswith(("espnet3/", "espnet2/"))]
    if not members:
        sys.exit(f"{wheel}: no espnet3/ or espnet2/ folder")
    zf.extractall(dest, members)
EOF
site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$SRC" >"$site/espnet-src.pth"

"$py" -c "import espnet3.systems.base.inference, espnet3.systems.base.metric, espnet3.systems.esp2_asr.metrics.wer, espnet3.systems.esp2_asr.metrics.cer, espnet3_prefect"
echo "$SRC" >"$stamp"
echo "parity venv ready: $VENV (espnet $ESPNET_VERSION) in $(( $(date +%s) - started )) s" >&2
