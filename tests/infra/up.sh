#!/usr/bin/env bash
# up.sh [slurm|sge|sshd|oar|all]... -- run the chosen *_up.sh scripts one after
# the other (apt/dpkg cannot run in parallel) and print their export lines.
#
#   eval "$(tests/infra/up.sh all)"
#
# Stdout: only `export ...` lines (each once); logs go to stderr.  When one
# service fails, the others are still brought up and their exports printed,
# but the exit status is 1.  Default: all.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
E3P_TAG=up
# shellcheck source=lib.sh
. "$HERE/lib.sh"

main() {
  [ $# -gt 0 ] || set -- all
  local s services=() exports="" out failed=()
  for s in "$@"; do
    case "$s" in
    all) services=(slurm sge sshd oar); break ;;
    slurm | sge | sshd | oar) services+=("$s") ;;
    ssh) services+=(sshd) ;;
    *) die "usage: $0 [slurm|sge|sshd|oar|all]..." ;;
    esac
  done
  for s in "${services[@]}"; do
    if out=$("$HERE/${s}_up.sh"); then
      exports+=$out$'\n'
    else
      log "FAILED: ${s}_up.sh"
      failed+=("$s")
    fi
  done
  # E3P_INFRA_DIR comes from every script; print each line once, in order.
  printf '%s' "$exports" | awk 'NF && !seen[$0]++'
  log "done in $(elapsed) s${failed[*]:+, failed: ${failed[*]}}"
  ((${#failed[@]} == 0))
}

main "$@"
