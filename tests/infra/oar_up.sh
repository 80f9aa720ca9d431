#!/usr/bin/env bash
# oar_up.sh -- a real one-host OAR 2.5.9 from Debian 12 (oar-server, oar-node, oar-user with the
# PostgreSQL backend), for the dask_jobqueue.OARCluster tests.  Root, no systemd.
#
#   database  a private PostgreSQL cluster in $E3P_INFRA_DIR/oar/pgdata on 127.0.0.1:$E3P_OAR_DB_PORT
#             (the system's own cluster, if any, is not used); throw-away settings (fsync off)
#   server    Almighty (listens on 0.0.0.0:6666: hard-coded in OAR 2.5.9), scheduler runs at
#             once after a submission (SCHEDULER_MIN_TIME_BETWEEN_2_CALLS=0), cpuset feature off
#   node      OAR's own sshd (/etc/oar/sshd_config, port 6667) on 127.0.0.1 only
#   resources one per core on host `hostname`: properties host, cpu, core, memcore
#             (memcore = MemTotal MiB / nproc, for memory_per_core_property_name: memcore)
#   user      $E3P_OAR_USER (default e3p): OAR refuses jobs from root and oar (admission rule),
#             so jobs are submitted as this user; $E3P_INFRA_DIR/oar/jobs is its to write
#   access    the tests run the flow as that user from this checkout (and its .venv): each folder
#             on the way to the checkout (and to $E3P_OAR_READ_PATHS) that the user cannot pass
#             gets an ACL entry u:<user>:x (o+x without ACL support), recorded in
#             $E3P_INFRA_DIR/oar/traverse.<user>; down.sh oar takes them back
#   state     $E3P_INFRA_DIR/oar/: pid files (postgres.pid, oar-node-sshd.pid, almighty.pid),
#             logs, the database, db.secret (generated passwords, mode 600)
#
# Idempotent: daemons still running from our pid files are kept (Almighty is restarted when
# oar.conf changed); the database and the resources are created once.
# Done when Almighty answers on 6666 and a job submitted as $E3P_OAR_USER ran to Terminated and
# wrote its output (E3P_INFRA_SMOKE=0 skips the job).  Stdout: export lines only.
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
E3P_TAG=oar_up
# shellcheck source=lib.sh
. "$HERE/lib.sh"

STATE=$E3P_INFRA_DIR/oar
SUBMIT_USER=${E3P_OAR_USER:-e3p}
QUEUE=default
H=$(hostname)
CONF=/etc/oar/oar.conf
ALMIGHTY_PORT=6666 # hard-coded in OAR 2.5.9

install_packages() {
  ensure_packages oar-server oar-node oar-user oar-server-pgsql oar-user-pgsql postgresql \
    libyaml-perl libjson-perl acl
  PGBIN=$(find /usr/lib/postgresql -maxdepth 2 -name bin -type d | sort -V | tail -1)
  [ -x "$PGBIN/initdb" ] || die "no PostgreSQL server binaries under /usr/lib/postgresql"
  log "packages ready ($(elapsed) s)"
}

# The database port: the one this state already uses, else E3P_OAR_DB_PORT, else 15432 if free.
pick_db_port() {
  if [ -s "$STATE/db.port" ]; then
    DBPORT=$(cat "$STATE/db.port")
  elif [ -n "${E3P_OAR_DB_PORT:-}" ]; then
    DBPORT=$E3P_OAR_DB_PORT
  elif [ -z "$(ss -Hltn 'sport = :15432' 2>/dev/null)" ]; then
    DBPORT=15432
  else
    DBPORT=$(free_port) || die "no free port for PostgreSQL"
  fi
  echo "$DBPORT" >"$STATE/db.port"
}

secrets() {
  if [ ! -s "$STATE/db.secret" ]; then
    (
      umask 077
      for k in ADMIN RW RO; do echo "$k=$(head -c 18 /dev/urandom | base64 | tr -dc 'A-Za-z0-9')"; done >"$STATE/db.secret"
    )
  fi
  # shellcheck disable=SC1091
  . "$STATE/db.secret"
}

postgres_pid() { head -1 "$STATE/pgdata/postmaster.pid" 2>/dev/null; }

start_postgres() {
  install -d -m 700 -o postgres -g postgres "$STATE/pgdata"
  install -d -m 755 -o postgres -g postgres "$STATE/pgsock" "$STATE/pglog"
  if [ ! -s "$STATE/pgdata/PG_VERSION" ]; then
    local pwf
    pwf=$(mktemp)
    printf '%s' "$ADMIN" >"$pwf"
    chown postgres "$pwf"
    runuser -u postgres -- "$PGBIN/initdb" -D "$STATE/pgdata" -U postgres --pwfile="$pwf" \
      --auth-local=trust --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$STATE/initdb.log" 2>&1 ||
      { rm -f "$pwf"; die "initdb failed (see $STATE/initdb.log)"; }
    rm -f "$pwf"
    cat >>"$STATE/pgdata/postgresql.conf" <<EOF
# tests/infra/oar_up.sh: private, loopback only, throw-away (no durability)
listen_addresses = '127.0.0.1'
port = $DBPORT
unix_socket_directories = '$STATE/pgsock'
shared_buffers = 32MB
fsync = off
synchronous_commit = off
full_page_writes = off
EOF
    log "initdb done ($(elapsed) s)"
  fi
  if ! pid_alive "$(postgres_pid)" postgres; then
    spawn "$STATE/pg_ctl.log" runuser -u postgres -- "$PGBIN/pg_ctl" -D "$STATE/pgdata" \
      -l "$STATE/pglog/postgres.log" -w -t "$E3P_WAIT_S" start ||
      die "postgres did not start: $(tail -3 "$STATE/pglog/postgres.log" "$STATE/pg_ctl.log" 2>&1)"
    log "postgres started on 127.0.0.1:$DBPORT ($(elapsed) s)"
  fi
  postgres_pid >"$STATE/postgres.pid"
}

# Edit oar.conf in place (sed -i keeps its owner oar and mode 600); CONF_CHANGED=1 if it changed.
configure_oar() {
  [ -f "$CONF.dist" ] || cp -p "$CONF" "$CONF.dist" # pristine copy, once
  local before
  before=$(md5sum <"$CONF")
  # SCHEDULER_MIN_TIME_BETWEEN_2_CALLS (default 5 s): a job submitted sooner after the last
  # scheduler run waits for Almighty's next 10 s poll.  CPUSET_PATH commented out: no cpusets.
  sed -i -e 's|^#\?SCHEDULER_MIN_TIME_BETWEEN_2_CALLS=.*|SCHEDULER_MIN_TIME_BETWEEN_2_CALLS=0|' \
    -e 's|^DB_TYPE=.*|DB_TYPE="Pg"|' \
    -e 's|^DB_HOSTNAME=.*|DB_HOSTNAME="127.0.0.1"|' \
    -e "s|^DB_PORT=.*|DB_PORT=\"$DBPORT\"|" \
    -e "s|^DB_BASE_PASSWD=.*|DB_BASE_PASSWD=\"$RW\"|" \
    -e "s|^DB_BASE_PASSWD_RO=.*|DB_BASE_PASSWD_RO=\"$RO\"|" \
    -e 's|^SERVER_HOSTNAME=.*|SERVER_HOSTNAME="localhost"|' \
    -e 's|^CPUSET_PATH=|#CPUSET_PATH=|' "$CONF"
  CONF_CHANGED=0
  [ "$(md5sum <"$CONF")" = "$before" ] || CONF_CHANGED=1
}

create_database() {
  local exists
  exists=$(runuser -u postgres -- psql -h "$STATE/pgsock" -p "$DBPORT" -U postgres -tAq \
    -c "select 1 from pg_database where datname='oar'")
  if [ "$exists" != 1 ]; then
    # --db-is-local would use the system cluster (su - postgres -c psql on the default socket)
    oar-database --create --db-admin-user postgres --db-admin-pass "$ADMIN" -y >"$STATE/oar-database.log" 2>&1 ||
      die "oar-database --create failed: $(tail -5 "$STATE/oar-database.log")"
    log "OAR database created ($(elapsed) s)"
  fi
  oar-database --check >/dev/null 2>&1 || die "oar-database --check: $(oar-database --check 2>&1 | tail -3)"
}

add_resources() {
  local props p
  props=$(oarproperty -l)
  for p in host cpu core memcore; do
    grep -qx "$p" <<<"$props" && continue
    if [ "$p" = host ]; then oarproperty -a host -c >/dev/null; else oarproperty -a "$p" >/dev/null; fi
  done
  if [ -z "$(oarnodes -l 2>/dev/null | grep -v '^/!' || true)" ]; then
    local n memcore c
    n=$(nproc)
    memcore=$(($(awk '/^MemTotal/ {print $2}' /proc/meminfo) / 1024 / n))
    for c in $(seq 0 $((n - 1))); do
      oarnodesetting -a -h "$H" -p host="$H" -p cpu=1 -p core=$((c + 1)) -p cpuset="$c" \
        -p memcore="$memcore" >/dev/null
    done
    log "$n resources on $H, memcore=$memcore MiB ($(elapsed) s)"
  fi
}

submit_user() {
  id "$SUBMIT_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$SUBMIT_USER"
  install -d -m 755 -o "$SUBMIT_USER" "$STATE/jobs" # oarsub writes OAR.<id>.std* into the cwd
}

# The checkout (tests/infra/../..) and E3P_OAR_READ_PATHS (colon-separated, e.g. a venv outside
# the checkout) must be reachable by the submit user: a CI clone under /root (mode 700) is not.
grant_checkout_access() {
  local paths=() extra p
  paths+=("$(cd "$HERE/../.." && pwd -P)")
  IFS=: read -r -a extra <<<"${E3P_OAR_READ_PATHS:-}"
  for p in "${extra[@]}"; do
    if [ -n "$p" ]; then paths+=("$p"); fi
  done
  grant_traverse "$SUBMIT_USER" "$STATE/traverse.$SUBMIT_USER" "${paths[@]}"
  runuser -u "$SUBMIT_USER" -- test -r "${paths[0]}/pyproject.toml" ||
    die "user $SUBMIT_USER cannot read ${paths[0]}/pyproject.toml (the checkout's files must be readable by others)"
}

start_node_sshd() {
  install -d -m 755 /run/sshd # privilege separation dir
  if ! pidfile_alive "$STATE/oar-node-sshd.pid" sshd; then
    # an absolute path (sshd re-executes itself); it forks and writes PidFile
    spawn "$STATE/oar-node-sshd.log" /usr/sbin/sshd -f /etc/oar/sshd_config -o ListenAddress=127.0.0.1 \
      -o PidFile="$STATE/oar-node-sshd.pid" -E "$STATE/oar-node-sshd.log"
    wait_until "$E3P_WAIT_S" pidfile_alive "$STATE/oar-node-sshd.pid" sshd ||
      die "OAR's node sshd did not start: $(tail -3 "$STATE/oar-node-sshd.log")"
    log "oar-node sshd started on 127.0.0.1:6667 ($(elapsed) s)"
  fi
}

almighty_listens() { (exec 3<>"/dev/tcp/127.0.0.1/$ALMIGHTY_PORT") 2>/dev/null; }

start_almighty() {
  if ((CONF_CHANGED)) && pidfile_alive "$STATE/almighty.pid" Almighty; then
    log "oar.conf changed: restarting Almighty"
    stop_almighty
  fi
  if ! pidfile_alive "$STATE/almighty.pid" Almighty; then
    ! almighty_listens || die "port $ALMIGHTY_PORT is taken by a process that is not our Almighty"
    # /usr/sbin/Almighty is setuid oar and executes perl in place, and setsid does not fork in a
    # background subshell: $! is the server's pid.  No lock fd, no caller stdout (see spawn).
    (cd / && exec setsid /usr/sbin/Almighty </dev/null >>"$STATE/almighty.log" 2>&1 {_E3P_LOCK_FD}>&-) &
    echo $! >"$STATE/almighty.pid"
    wait_until "$E3P_WAIT_S" almighty_listens || die "Almighty does not listen on $ALMIGHTY_PORT: $(tail -3 /var/log/oar.log)"
    pidfile_alive "$STATE/almighty.pid" Almighty || die "Almighty died: $(tail -3 "$STATE/almighty.log")"
    log "Almighty started ($(elapsed) s)"
  fi
}

stop_almighty() { stop_pidfile_tree "$STATE/almighty.pid" Almighty; }

job_state() { oarstat -s -j "$1" 2>/dev/null | awk -F': ' '{print $2}'; }

smoke() {
  [ "${E3P_INFRA_SMOKE:-1}" = 1 ] || return 0
  local out id st
  out=$(cd "$STATE/jobs" && timeout "$E3P_WAIT_S" runuser -u "$SUBMIT_USER" -- \
    oarsub -q "$QUEUE" -l core=1,walltime=0:01:00 'echo e3p-smoke-$OAR_JOB_ID' 2>&1) ||
    die "oarsub smoke job refused: $out"
  id=$(sed -n 's/^OAR_JOB_ID=//p' <<<"$out")
  [[ $id =~ ^[0-9]+$ ]] || die "oarsub smoke job: no job id in: $out"
  ended() { st=$(job_state "$1"); [ "$st" = Terminated ] || [ "$st" = Error ]; }
  wait_until "$E3P_WAIT_S" ended "$id" || die "smoke job $id not finished after $E3P_WAIT_S s ($(job_state "$id"))"
  st=$(job_state "$id")
  grep -q "e3p-smoke-$id" "$STATE/jobs/OAR.$id.stdout" 2>/dev/null && [ "$st" = Terminated ] ||
    die "smoke job $id ended $st: $(oarstat -f -j "$id" 2>&1 | grep -iE 'state|event|message' | head -5)"
  rm -f "$STATE/jobs/OAR.$id.stdout" "$STATE/jobs/OAR.$id.stderr"
  log "oarsub smoke job $id ok ($(elapsed) s)"
}

main() {
  cd / # postgres, e3p and the daemons need not be able to enter the caller's folder (a checkout under /root)
  lock_service oar
  install -d -m 755 "$STATE"
  install_packages
  pick_db_port
  secrets
  start_postgres
  configure_oar
  create_database
  add_resources
  submit_user
  grant_checkout_access
  start_node_sshd
  start_almighty
  smoke
  log "ready in $(elapsed) s"
  emit_env oar "E3P_OAR_QUEUE=$QUEUE" "E3P_OAR_USER=$SUBMIT_USER" "E3P_OAR_MEMCORE_PROPERTY=memcore"
}

main "$@"
