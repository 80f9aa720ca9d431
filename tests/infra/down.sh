#!/usr/bin/env bash
# down.sh [slurm|sge|sshd|all]... -- stop what the *_up.sh scripts started.
#
# Only processes named in our pid files under $E3P_INFRA_DIR are signalled
# (and only if the process name still matches), never anything found by name.
# Jobs still queued or running are cancelled first (scancel / qdel) and we
# wait for them to go, so no dask worker outlives its scheduler daemon.
# Packages, configs, keys and logs stay, which keeps the next up fast.
# Safe to run when nothing is up.  Default: all.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
E3P_TAG=down
# shellcheck source=lib.sh
. "$HERE/lib.sh"

# Poll CMD until it prints nothing (bounded); warn if it never does.
wait_empty() { # wait_empty WHAT CMD...
  local what=$1; shift
  local end=$((SECONDS + 30))
  while [ -n "$("$@" 2>/dev/null)" ]; do
    if ((SECONDS >= end)); then
      log "WARNING: $what still listed after 30 s"
      return 0
    fi
    sleep 0.5
  done
}

down_slurm() {
  local st=$E3P_INFRA_DIR/slurm
  if pidfile_alive "$st/slurmctld.pid" slurmctld; then
    local jobs
    jobs=$(squeue -h -o %A 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      log "cancelling slurm jobs: ${jobs//$'\n'/ }"
      # shellcheck disable=SC2086
      scancel $jobs 2>/dev/null || true
      wait_empty "slurm jobs" squeue -h -o %A
    fi
  fi
  stop_pidfile "$st/slurmd.pid" slurmd
  stop_pidfile "$st/slurmctld.pid" slurmctld
  stop_pidfile "$st/munged.pid" munged # only if we started it
  rm -f "$E3P_INFRA_DIR/slurm.env"
}

down_sge() {
  local st=$E3P_INFRA_DIR/sge
  if pidfile_alive "$st/qmaster.pid" sge_qmaster; then
    export SGE_ROOT=${SGE_ROOT:-/var/lib/gridengine} SGE_CELL=${SGE_CELL:-default}
    if [ -n "$(qstat -u '*' 2>/dev/null)" ]; then
      log "deleting sge jobs"
      qdel -u '*' >/dev/null 2>&1 || true
      wait_empty "sge jobs" qstat -u '*'
    fi
  fi
  stop_pidfile "$st/execd.pid" sge_execd
  stop_pidfile "$st/qmaster.pid" sge_qmaster
  rm -f "$E3P_INFRA_DIR/sge.env"
}

down_ssh() {
  # Sessions already open keep their own sshd processes; SSHCluster.close()
  # ends them.  We stop the listener.
  stop_pidfile "$E3P_INFRA_DIR/ssh/sshd.pid" sshd
  rm -f "$E3P_INFRA_DIR/ssh.env"
}

main() {
  [ $# -gt 0 ] || set -- all
  local s
  for s in "$@"; do
    case "$s" in
    all) set -- slurm sge ssh; break ;;
    slurm | sge | ssh | sshd) ;;
    *) die "usage: $0 [slurm|sge|sshd|all]..." ;;
    esac
  done
  [ -d "$E3P_INFRA_DIR" ] || { log "nothing to stop ($E3P_INFRA_DIR does not exist)"; return 0; }
  for s in "$@"; do
    [ "$s" = sshd ] && s=ssh
    lock_service "$s"
    "down_$s"
    exec {_E3P_LOCK_FD}>&- # release this service's lock
  done
  log "done in $(elapsed) s"
}

main "$@"
