# The recipe's modules (dataset/, src/) and the TEMPLATE's, importable as run.py expects.
MAIN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../../.." && pwd)
export PYTHONPATH="${MAIN_ROOT}:${MAIN_ROOT}/egs3/TEMPLATE/f5tts:$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd):${PYTHONPATH:-}"
