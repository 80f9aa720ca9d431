#!/usr/bin/env bash
# slurm_up.sh -- a real one-node SLURM (Debian 12: slurm 22.05 + munge) on this
# machine, for the dask_jobqueue.SLURMCluster tests.  Root, no systemd.
#
#   node     `hostname -s`, NodeAddr 127.0.0.1, CPUs = nproc
#   queue    partition $E3P_SLURM_PARTITION (default "debug", the default one)
#   sharing  OverSubscribe=$E3P_SLURM_OVERSUB (default FORCE:4): up to 4 jobs per
#            core, so 2-4 one-core dask workers run at once even on 2 CPUs
#   config   /etc/slurm/slurm.conf (where the clients look without any env)
#   state    $E3P_INFRA_DIR/slurm/: pid files, logs, spool dirs
#
# Idempotent: daemons already running from our pid files are kept as long as
# the generated slurm.conf did not change; otherwise they are restarted.
# Done when `sinfo` shows the node idle and a one-task `srun` ran
# (E3P_INFRA_SMOKE=0 skips the srun).  Stdout: export lines only.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
E3P_TAG=slurm_up
# shellcheck source=lib.sh
. "$HERE/lib.sh"

PART=${E3P_SLURM_PARTITION:-debug}
OVERSUB=${E3P_SLURM_OVERSUB:-FORCE:4}
CPUS=${E3P_SLURM_CPUS:-$(nproc)}
NODE=$(hostname -s)
STATE=$E3P_INFRA_DIR/slurm
CONF=/etc/slurm/slurm.conf

install() {
  ensure_packages munge slurmctld slurmd slurm-client
  log "packages ready ($(elapsed) s)"
}

# munged must run as user munge.  It writes its own pid file under /run/munge;
# we copy the pid into our state dir.  A munged we did not start (system one)
# is used as is and never recorded, so down.sh leaves it alone.
start_munge() {
  if pidfile_alive "$STATE/munged.pid" munged; then return 0; fi
  if munge -n </dev/null 2>/dev/null | unmunge >/dev/null 2>&1; then
    log "using an already running munged (not ours)"
    return 0
  fi
  mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge
  chmod 0755 /run/munge
  chmod 0700 /etc/munge /var/log/munge
  if [ ! -s /etc/munge/munge.key ]; then # the package's postinst normally makes one
    dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
  fi
  chown munge:munge /etc/munge/munge.key
  chmod 0400 /etc/munge/munge.key
  rm -f /run/munge/munged.pid /run/munge/munge.socket.2*
  spawn "$STATE/start.log" runuser -u munge -- /usr/sbin/munged # forks into the background
  wait_until 10 test -s /run/munge/munged.pid || die "munged wrote no pid file"
  cp /run/munge/munged.pid "$STATE/munged.pid"
  wait_until "$E3P_WAIT_S" sh -c 'munge -n </dev/null | unmunge' || die "munge does not work"
}

# Write the config to a temp file; if it differs from the installed one,
# replace that and set CONF_CHANGED=1 (running daemons must then restart).
CONF_CHANGED=0
write_config() {
  local mem det tmp
  # RealMemory must not exceed what slurmd detects, or the node is drained.
  det=$(slurmd -C | sed -n 's/.*RealMemory=\([0-9]*\).*/\1/p')
  mem=$((det > 1024 ? det - 512 : det))
  mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d"
  tmp=$(mktemp)
  cat >"$tmp" <<EOF
# Written by tests/infra/slurm_up.sh: one node, test use only.
ClusterName=e3p
SlurmctldHost=${NODE}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CryptoType=crypto/munge
MpiDefault=none
MailProg=/bin/true
# no cgroups in this VM: track processes by parent pid, no task binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# short timeouts: tests want quick start-up and quick cancel
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
MinJobAge=30
KillWait=5
Waittime=0
MessageTimeout=10
NodeName=${NODE} NodeAddr=127.0.0.1 CPUs=${CPUS} RealMemory=${mem} State=UNKNOWN
PartitionName=${PART} Nodes=${NODE} Default=YES MaxTime=INFINITE State=UP OverSubscribe=${OVERSUB}
EOF
  if cmp -s "$tmp" "$CONF"; then
    rm -f "$tmp"
  else
    mv "$tmp" "$CONF"
    chmod 644 "$CONF"
    CONF_CHANGED=1
  fi
}

node_state() { sinfo -h -n "$NODE" -o %t 2>/dev/null; }

node_ready() {
  case "$(node_state)" in
  idle* | mix* | alloc*) return 0 ;;
  down* | drain* | drng* | fail*) # e.g. left over from an unclean stop
    scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
    return 1 ;;
  *) return 1 ;;
  esac
}

start_slurm() {
  if ((CONF_CHANGED)); then
    log "slurm.conf changed: (re)starting slurmctld and slurmd"
    stop_pidfile "$STATE/slurmd.pid" slurmd
    stop_pidfile "$STATE/slurmctld.pid" slurmctld
  fi
  if ! pidfile_alive "$STATE/slurmctld.pid" slurmctld; then
    # -c: start from a clean state, forgetting jobs of an earlier run
    spawn "$STATE/start.log" /usr/sbin/slurmctld -c
    wait_until "$E3P_WAIT_S" sh -c 'scontrol ping | grep -q UP' || die "slurmctld did not come up (see $STATE/slurmctld.log)"
    log "slurmctld started ($(elapsed) s)"
  fi
  if ! pidfile_alive "$STATE/slurmd.pid" slurmd; then
    spawn "$STATE/start.log" /usr/sbin/slurmd
    log "slurmd started ($(elapsed) s)"
  fi
  wait_until "$E3P_WAIT_S" node_ready || die "node $NODE not idle: '$(node_state)' (see $STATE/slurmd.log)"
  log "node $NODE is $(node_state) ($(elapsed) s)"
}

smoke() {
  [ "${E3P_INFRA_SMOKE:-1}" = 1 ] || return 0
  timeout "$E3P_WAIT_S" srun -p "$PART" -N1 -n1 -t 1 true || die "srun smoke job failed"
  log "srun smoke job ok ($(elapsed) s)"
}

main() {
  lock_service slurm
  mkdir -p "$STATE"
  install
  start_munge
  write_config
  start_slurm
  smoke
  log "ready in $(elapsed) s"
  emit_env slurm "E3P_SLURM_PARTITION=$PART" "SLURM_CONF=$CONF"
}

main "$@"
