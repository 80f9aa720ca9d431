#!/usr/bin/env bash
# down.sh [slurm|sge|sshd|oar|all]... -- stop what the *_up.sh scripts started.
#
# Only processes named in our pid files under $E3P_INFRA_DIR are signalled
# (and only if the process name still matches), never anything found by name.
# Jobs still queued or running are cancelled first (scancel / qdel / oardel) and we
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

# OAR: jobs first (oardel as root, the OAR admin; deleted jobs end in state Error), then
# Almighty and what it forked, OAR's node sshd, the private PostgreSQL (pg_ctl reads the
# postmaster's pid from its own pid file; we checked that pid's name first).
oar_job_ids() { oarstat 2>/dev/null | awk '$1 ~ /^[0-9]+$/ { print $1 }'; }

down_oar() {
  local st=$E3P_INFRA_DIR/oar jobs pid
  if pidfile_alive "$st/almighty.pid" Almighty; then
    jobs=$(oar_job_ids)
    if [ -n "$jobs" ]; then
      log "deleting oar jobs: ${jobs//$'\n'/ }"
      # shellcheck disable=SC2086
      oardel $jobs >/dev/null 2>&1 || true
      wait_empty "oar jobs" oar_job_ids
    fi
  fi
  stop_pidfile_tree "$st/almighty.pid" Almighty
  stop_pidfile "$st/oar-node-sshd.pid" sshd
  pid=$(cat "$st/postgres.pid" 2>/dev/null || true)
  if pid_alive "$pid" postgres && [ "$pid" = "$(head -1 "$st/pgdata/postmaster.pid" 2>/dev/null)" ]; then
    local pgbin
    pgbin=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d | sort -V | tail -1)
    runuser -u postgres -- "$pgbin/pg_ctl" -D "$st/pgdata" -m fast -w -t 30 stop >/dev/null 2>&1 ||
      stop_pidfile "$st/postgres.pid" postgres
    log "stopped postgres (pid $pid)"
  fi
  rm -f "$st/postgres.pid" "$E3P_INFRA_DIR/oar.env"
  local record
  for record in "$st"/traverse.*; do # what oar_up.sh granted the submit user on the way to the checkout
    [ -e "$record" ] || continue  # no grant recorded (the checkout was reachable already)
    revoke_traverse "${record##*/traverse.}" "$record"
  done
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
    all) set -- slurm sge ssh oar; break ;;
    slurm | sge | ssh | sshd | oar) ;;
    *) die "usage: $0 [slurm|sge|sshd|oar|all]..." ;;
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
