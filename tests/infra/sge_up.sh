#!/usr/bin/env bash
# sge_up.sh -- a real one-host (Son of) Grid Engine 8.1.9 from Debian 12, for
# the dask_jobqueue.SGECluster tests.  Root, no systemd.
#
#   queue    $E3P_SGE_QUEUE (default all.q) on host `hostname`,
#            slots $E3P_SGE_SLOTS (default: nproc, at least 4)
#   SGE      SGE_ROOT=/var/lib/gridengine, SGE_CELL=default (Debian layout; the
#            /usr/bin wrappers default to these, we export them anyway)
#   state    $E3P_INFRA_DIR/sge/: our copies of the daemons' pid files, logs
#
# Idempotent: a qmaster/execd still running from our pid files is kept; the
# configuration below is (re)applied on every run, which is cheap.
# Done when `qhost` answers, the queue instance reports load with no error or
# alarm state and a `qsub -sync y` job ran (E3P_INFRA_SMOKE=0 skips the job).
# Stdout: export lines only.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
E3P_TAG=sge_up
# shellcheck source=lib.sh
. "$HERE/lib.sh"

export SGE_ROOT=/var/lib/gridengine SGE_CELL=default
QUEUE=${E3P_SGE_QUEUE:-all.q}
SLOTS=${E3P_SGE_SLOTS:-$(($(nproc) > 4 ? $(nproc) : 4))}
H=$(hostname)
STATE=$E3P_INFRA_DIR/sge
SPOOL=/var/spool/gridengine
QMASTER_PIDFILE=$SPOOL/qmaster/qmaster.pid

install() {
  # The package asks (debconf) for the master host and whether to create the
  # cell; without these answers act_qmaster stays empty.
  debconf-set-selections <<EOF
gridengine-common shared/gridenginemaster string $H
gridengine-common shared/gridenginecell string $SGE_CELL
gridengine-common shared/gridengineconfig boolean true
EOF
  ensure_packages gridengine-master gridengine-exec gridengine-client
  log "packages ready ($(elapsed) s)"
}

# Name resolution: /etc/hosts maps 127.0.0.1 to "localhost" first, so the
# daemons see connections from "localhost" while the host calls itself $H and
# reject them ("access denied").  host_aliases makes both names one host.
prepare_cell() {
  local common=$SGE_ROOT/$SGE_CELL/common
  [ -d "$common" ] || die "$common missing: the package did not create the cell"
  echo "$H" >"$common/act_qmaster"
  echo "$H localhost" >"$common/host_aliases"
  mkdir -p /var/run/gridengine
  chown sgeadmin:sgeadmin /var/run/gridengine
}

# qconf -m* opens $EDITOR on a temp file; a sed script acts as the "editor".
# qconf exits non-zero when nothing changed, hence the `|| true`.
qconf_edit() { # qconf_edit OPTION SED-EXPRESSIONS...
  local opt=$1 ed
  shift
  ed=$(mktemp)
  # shellcheck disable=SC2016 # "$1" is for the generated script, not for us
  { echo '#!/bin/sh'; printf 'sed -i'; printf " -e '%s'" "$@"; echo ' "$1"'; } >"$ed"
  chmod +x "$ed"
  EDITOR=$ed qconf "$opt" >/dev/null 2>&1 || true
  rm -f "$ed"
}

start_qmaster() {
  if pidfile_alive "$STATE/qmaster.pid" sge_qmaster && qhost >/dev/null 2>&1; then return 0; fi
  stop_pidfile "$STATE/qmaster.pid" sge_qmaster
  spawn "$STATE/start.log" /usr/sbin/sge_qmaster # forks; runs as sgeadmin
  wait_until "$E3P_WAIT_S" qconf -sh || die "sge_qmaster did not answer (see $SPOOL/qmaster/messages)"
  cp "$QMASTER_PIDFILE" "$STATE/qmaster.pid"
  log "sge_qmaster started ($(elapsed) s)"
}

configure() {
  # Global config: root (uid/gid 0) may run jobs -- the default min_uid 1000
  # would refuse them; quicker load reports; no mail.  This must be in place
  # before execd starts, since a running execd keeps the values it read.
  qconf_edit -mconf 's/^min_uid .*/min_uid 0/' 's/^min_gid .*/min_gid 0/' \
    's/^load_report_time .*/load_report_time 00:00:05/' 's|^mailer .*|mailer /bin/true|'
  # Scheduler: run every second and right after submits/finishes (default 15 s).
  qconf_edit -msconf 's/^schedule_interval .*/schedule_interval 0:0:1/' \
    's/^flush_submit_sec .*/flush_submit_sec 1/' 's/^flush_finish_sec .*/flush_finish_sec 1/'
  qconf -as "$H" >/dev/null 2>&1 || true # submit host (admin host comes from the package)
}

# execd writes its pid to $SPOOL/execd/<name>/execd.pid, where <name> is how
# it resolves itself -- "localhost" here, not $H -- so look in every dir.
find_execd_pid() {
  local f
  for f in "$SPOOL"/execd/*/execd.pid; do
    pid_alive "$(cat "$f" 2>/dev/null)" sge_execd && { cat "$f"; return 0; }
  done
  return 1
}

start_execd() {
  if ! pidfile_alive "$STATE/execd.pid" sge_execd; then
    stop_pidfile "$STATE/execd.pid" sge_execd
    spawn "$STATE/start.log" /usr/sbin/sge_execd # registers itself as exec host
    wait_until "$E3P_WAIT_S" find_execd_pid || die "no running sge_execd found"
    find_execd_pid >"$STATE/execd.pid"
    log "sge_execd started ($(elapsed) s)"
  fi
  wait_until "$E3P_WAIT_S" sh -c "qconf -sel | grep -qx '$H'" || die "exec host $H did not register"
}

setup_queue() {
  if ! qconf -sql 2>/dev/null | grep -qx "$QUEUE"; then
    # The default queue template refers to a pe "smp" that does not exist.
    local ed
    ed=$(mktemp)
    cat >"$ed" <<EOF
#!/bin/sh
sed -i -e 's/^qname .*/qname $QUEUE/' -e 's/^hostlist .*/hostlist $H/' \
  -e 's/^pe_list .*/pe_list NONE/' -e 's|^shell .*|shell /bin/bash|' "\$1"
EOF
    chmod +x "$ed"
    EDITOR=$ed qconf -aq "$QUEUE" >/dev/null
    rm -f "$ed"
  fi
  # Never put the queue in alarm on a busy box; slots as requested.
  qconf -rattr queue load_thresholds NONE "$QUEUE" >/dev/null 2>&1 || true
  qconf -mattr queue slots "$SLOTS" "$QUEUE" >/dev/null 2>&1 || true
  qmod -cq "$QUEUE" >/dev/null 2>&1 || true # clear an error state left from before
}

# The queue instance is usable once it has load values and no state letters
# (a = alarm, u = unknown, E = error, d = disabled, ...).
queue_ready() {
  qstat -f -q "$QUEUE" | awk -v q="$QUEUE@" '
    index($1, q) == 1 { seen = 1; if ($4 == "-NA-" || NF > 5) bad = 1 }
    END { exit !(seen && !bad) }'
}

smoke() {
  [ "${E3P_INFRA_SMOKE:-1}" = 1 ] || return 0
  timeout "$E3P_WAIT_S" qsub -sync y -b y -q "$QUEUE" -o /dev/null -e /dev/null true >/dev/null ||
    die "qsub -sync y smoke job failed"
  log "qsub smoke job ok ($(elapsed) s)"
}

main() {
  lock_service sge
  mkdir -p "$STATE"
  install
  prepare_cell
  start_qmaster
  configure
  start_execd
  setup_queue
  wait_until "$E3P_WAIT_S" queue_ready || die "queue $QUEUE not ready: $(qstat -f -q "$QUEUE" | tail -n +3)"
  log "queue $QUEUE ready ($(elapsed) s)"
  smoke
  log "ready in $(elapsed) s"
  emit_env sge "SGE_ROOT=$SGE_ROOT" "SGE_CELL=$SGE_CELL" "E3P_SGE_QUEUE=$QUEUE"
}

main "$@"
