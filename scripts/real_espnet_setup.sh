#!/usr/bin/env bash
# Build .venv-espnet: the real ESPnet from PyPI (espnet[train,asr]==202611, its own torch and
# torchaudio) with this project installed editable on top, for the tests under tests/realespnet
# (`pytest -m realespnet`), which run the shipped mini_an4 recipe end to end.
#
#   bash scripts/real_espnet_setup.sh
#   .venv-espnet/bin/python -m pytest -m realespnet tests/realespnet
#
# Order matters: ESPnet is resolved first, then the versions it chose for the packages both
# sides care about are frozen into a constraints file, so installing this project cannot move
# torch (our [test] extra pins another torch, hence `-e .` with the extras the tests import, plus pytest).
# prefect wants python-dateutil<3, so pip downgrades it; nothing else changes.
#
# Idempotent: the stamp records a hash of pyproject.toml, this script and the interpreter; a
# re-run with the same three returns at once. Any failure ends with one line naming the step
# and its log. E3P_ESPNET_PYTHON overrides the interpreter (3.12, else 3.13, by default).
set -uo pipefail
cd "$(dirname "$0")/.."
ESPNET_SPEC="espnet[train,asr]==202611"
# What espnet3.systems.f5tts imports beyond [train,asr] (tests/realespnet/test_f5tts.py): Vocos, the
# vocoder F5TTSInference loads (it brings encodec; ~10 s). Not espnet[tts]: pyworld, g2p and the
# other front ends it adds are not what the F5-TTS system imports.
F5TTS_EXTRAS="vocos==0.1.0"
VENV=.venv-espnet
LOGS="$VENV/setup-logs"
STAMP="$VENV/.setup-stamp"
PINNED="torch torchaudio numpy dask distributed omegaconf hydra-core lightning scipy soundfile librosa"
started=$(date +%s)

fail() { echo "real_espnet_setup: FAILED: $*" >&2; exit 1; }
elapsed() { echo "$(( $(date +%s) - started )) s"; }

# shellcheck source=python.sh
PYTHON=unused . scripts/python.sh
PYTHON=${E3P_ESPNET_PYTHON:-$(pick_python 3.12 3.13)}
version=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
  || fail "no usable interpreter ($PYTHON)"
case "$version" in 3.12|3.13) ;; *) fail "ESPnet 202611 needs Python 3.12 or 3.13, found $version at $PYTHON";; esac

key=$(cat pyproject.toml recipes/dtmf/pyproject.toml scripts/real_espnet_setup.sh <(echo "$PYTHON $version $ESPNET_SPEC") | sha256sum | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$key" ] && [ -x "$VENV/bin/python" ]; then
  echo "real_espnet_setup: $VENV up to date ($(elapsed))" >&2
  exit 0
fi
rm -f "$STAMP"

step() {  # step NAME CMD... : run CMD with its output in $LOGS/NAME.log
  local name=$1; shift
  echo "+ [$name] $*" >&2
  "$@" >"$LOGS/$name.log" 2>&1 || fail "step '$name' exited $? (log: $LOGS/$name.log)"
}

if [ -x "$VENV/bin/python" ] && [ "$("$VENV/bin/python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "$version" ]; then
  echo "+ $VENV was made with another Python: rebuilding it with $version" >&2
  rm -rf "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV" || fail "could not create $VENV with $PYTHON"
fi
mkdir -p "$LOGS"
py="$VENV/bin/python"
pip=("$py" -m pip --disable-pip-version-check)

step pip-upgrade "${pip[@]}" install -q --upgrade pip
step espnet "${pip[@]}" install "$ESPNET_SPEC"

# Freeze what ESPnet resolved for the shared packages; installing the project must keep it.
constraints="$VENV/espnet-constraints.txt"
"${pip[@]}" freeze >"$LOGS/freeze-espnet.txt" || fail "pip freeze failed"
pattern="^($(echo "$PINNED" | tr ' ' '|'))=="
grep -iE "$pattern" "$LOGS/freeze-espnet.txt" >"$constraints"
for name in $PINNED; do
  grep -qiE "^$name==" "$constraints" || fail "$ESPNET_SPEC did not install $name (see $LOGS/freeze-espnet.txt)"
done

# The project with the extras its unit tests import (not [test]: it pins another torch). CI runs the
# unit tests here too, where the real espnet3 is importable (.ci/run, layer real-espnet).
step project editable_install "${pip[@]}" install -c "$constraints" -e ".[slurm,ssh,kube,metrics,audio]" -e recipes/dtmf pytest $F5TTS_EXTRAS
"${pip[@]}" freeze >"$LOGS/freeze-final.txt" || fail "pip freeze failed"
moved=$(grep -iE "$pattern" "$LOGS/freeze-final.txt" | diff "$constraints" - | grep '^[<>]' | tr '\n' ' ')
[ -z "$moved" ] || fail "installing the project changed pinned packages: $moved"
step pip-check "${pip[@]}" check
step import "$py" -c "import torch, torchaudio, espnet3, espnet3_prefect, dtmf_demo, soundfile, jiwer, pytest
import egs3.mini_an4.esp2_asr, egs3.TEMPLATE.esp2_asr, egs3.TEMPLATE.f5tts, vocos
import espnet3.systems.f5tts.system, espnet3.systems.f5tts.inference
print('torch', torch.__version__, 'torchaudio', torchaudio.__version__)"

echo "$key" >"$STAMP"
echo "real_espnet_setup: $VENV ready in $(elapsed) ($(cat "$LOGS/import.log"); $(du -sh "$VENV" | cut -f1))" >&2
