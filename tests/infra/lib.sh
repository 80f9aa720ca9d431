# shellcheck shell=bash
# lib.sh -- helpers shared by the tests/infra/*.sh scripts.  Sourced, never run.
#
# Conventions every script follows:
#   * stdout carries ONLY `export NAME=value` lines (so callers can `eval "$(...)"`);
#     everything else (apt output, progress, timings) goes to stderr.
#   * every daemon we start gets a pid file under $E3P_INFRA_DIR/<service>/;
#     down.sh stops processes found in those files and nothing else.
#   * waits are bounded (E3P_WAIT_S, default 60 s), package installs are bounded
#     (E3P_APT_TIMEOUT, default 300 s).

E3P_INFRA_DIR=${E3P_INFRA_DIR:-${TMPDIR:-/tmp}/e3p-infra}
E3P_WAIT_S=${E3P_WAIT_S:-60}
E3P_APT_TIMEOUT=${E3P_APT_TIMEOUT:-300}
export E3P_INFRA_DIR

log() { printf '[%s %s] %s\n' "${E3P_TAG:-infra}" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# Seconds (with ms) since the script started; for the timing lines in the log.
_T0=$EPOCHREALTIME
elapsed() { awk -v a="$_T0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# wait_until SECONDS CMD [ARGS...]: re-run CMD every 0.25 s until it succeeds.
# Returns 1 when the time is up.  CMD's output is discarded.
wait_until() {
  local limit=$1; shift
  local end=$((SECONDS + limit))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < end)) || return 1
    sleep 0.25
  done
}

# Take an exclusive lock for this service so two callers (say two pytest
# sessions) do not start or stop the same daemons at the same time.
lock_service() {
  mkdir -p "$E3P_INFRA_DIR"
  exec {_E3P_LOCK_FD}>"$E3P_INFRA_DIR/.lock.$1"
  flock -w 300 "$_E3P_LOCK_FD" || die "could not lock $E3P_INFRA_DIR/.lock.$1"
}

# spawn LOGFILE CMD [ARGS...]: start a daemon that forks into the background.
# Its stdio goes to LOGFILE, and it must not inherit our lock fd (a daemon
# holding the lock would block every later up/down run) nor the caller's
# stdout (a caller doing `$(up.sh)` would wait for the daemon to exit).
spawn() {
  local logfile=$1; shift
  if [ -n "${_E3P_LOCK_FD:-}" ]; then
    "$@" </dev/null >>"$logfile" 2>&1 {_E3P_LOCK_FD}>&-
  else
    "$@" </dev/null >>"$logfile" 2>&1
  fi
}

# ---------------------------------------------------------------- pids ------
# pid_alive PID COMM: true if PID is running (not a zombie) and its process
# name is COMM.  The name check keeps us from signalling an unrelated process
# that happens to have re-used a stale pid.
pid_alive() {
  local pid=$1 comm=$2 state
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  [ -r "/proc/$pid/comm" ] || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$comm" ] || return 1
  state=$(awk '/^State:/ { print $2 }' "/proc/$pid/status" 2>/dev/null)
  [ -n "$state" ] && [ "$state" != Z ]
}

# pidfile_alive FILE COMM: the pid recorded in FILE is alive and named COMM.
pidfile_alive() { pid_alive "$(cat "$1" 2>/dev/null)" "$2"; }

# stop_pidfile FILE COMM: SIGTERM the recorded process, wait up to 15 s,
# then SIGKILL; remove FILE.  A missing file or dead pid is not an error.
stop_pidfile() {
  local file=$1 comm=$2 pid
  pid=$(cat "$file" 2>/dev/null || true)
  if pid_alive "$pid" "$comm"; then
    kill -TERM "$pid" 2>/dev/null || true
    local end=$((SECONDS + 15))
    while pid_alive "$pid" "$comm" && ((SECONDS < end)); do sleep 0.2; done
    if pid_alive "$pid" "$comm"; then
      log "$comm ($pid) ignored SIGTERM, sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.5
    fi
    log "stopped $comm (pid $pid)"
  fi
  rm -f "$file"
}

# descendants PID: "pid comm" of every descendant of PID, found by parent pid (not by name).
descendants() {
  local k
  for k in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    echo "$k $(cat "/proc/$k/comm" 2>/dev/null)"
    descendants "$k"
  done
}

# stop_pidfile_tree FILE COMM: stop_pidfile, then SIGTERM the processes the recorded one had
# forked (listed before it was stopped), each only if it still has the name it had then.
stop_pidfile_tree() {
  local file=$1 comm=$2 pid kids kid kcomm
  pid=$(cat "$file" 2>/dev/null || true)
  kids=""
  pid_alive "$pid" "$comm" && kids=$(descendants "$pid")
  stop_pidfile "$file" "$comm"
  while read -r kid kcomm; do
    [ -n "$kid" ] || continue
    if pid_alive "$kid" "$kcomm"; then
      kill -TERM "$kid" 2>/dev/null || true
      log "stopped $kcomm (pid $kid, forked by $comm)"
    fi
  done <<<"$kids"
}

# ------------------------------------------------------------ traverse ------
# grant_traverse USER RECORD PATH...: let USER reach each PATH from / (search permission, x, on
# every folder on the way, PATH included), changing only the folders USER cannot pass yet: an ACL
# entry u:USER:x (setfacl, Debian package acl), or o+x where the file system takes no ACL.
# Each change is a line of RECORD, "acl-new - DIR", "acl - DIR" or "mode OCTAL DIR", for
# revoke_traverse.
grant_traverse() {
  local user=$1 record=$2 path dir rest part kind
  shift 2
  for path in "$@"; do
    path=$(realpath -e "$path") || die "grant_traverse: no such path: $path"
    dir=/ rest=${path#/}
    while :; do
      if ! runuser -u "$user" -- test -x "$dir" 2>/dev/null; then
        if command -v setfacl >/dev/null && command -v getfacl >/dev/null; then
          kind=acl
          [ -n "$(getfacl -cps --skip-base "$dir" 2>/dev/null)" ] || kind=acl-new
          if setfacl -m "u:$user:x" "$dir" 2>/dev/null; then
            printf '%s - %s\n' "$kind" "$dir" >>"$record"
            log "granted $user traverse (ACL u:$user:x) on $dir"
          fi
        fi
        if ! runuser -u "$user" -- test -x "$dir" 2>/dev/null; then
          printf 'mode %s %s\n' "$(stat -c %a "$dir")" "$dir" >>"$record"
          chmod o+x "$dir"
          log "granted traverse to others (o+x) on $dir: no ACL here"
        fi
      fi
      [ -n "$rest" ] || break
      part=${rest%%/*}
      rest=${rest#"$part"}
      rest=${rest#/}
      dir=${dir%/}/$part
    done
  done
}

# revoke_traverse USER RECORD: undo what grant_traverse recorded (last change first); remove RECORD.
revoke_traverse() {
  local user=$1 record=$2 kind mode dir
  [ -s "$record" ] || { rm -f "$record"; return 0; }
  while read -r kind mode dir; do
    [ -e "$dir" ] || continue
    case "$kind" in
    acl-new) setfacl -b "$dir" 2>/dev/null || true ;; # it had no ACL before: none again
    acl) setfacl -x "u:$user" "$dir" 2>/dev/null || true ;;
    mode) chmod "$mode" "$dir" ;;
    esac
    log "took back $user's traverse on $dir ($kind)"
  done < <(tac "$record")
  rm -f "$record"
}

# ------------------------------------------------------------- packages -----
# ensure_packages PKG...: install whatever is not installed yet.  Installs
# without recommends, non-interactively, under `timeout`.  If the first try
# fails (typically: empty or stale package lists) run `apt-get update` and
# try once more.  Package maintainer scripts must not start services (we have
# no init system and want only daemons we track), so a policy-rc.d that says
# "no" is put in place for the duration unless one already exists.
ensure_packages() {
  local missing=() p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
  done
  ((${#missing[@]})) || return 0
  log "installing: ${missing[*]}"
  local made_policy=0 rc=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  local apt=(timeout "$E3P_APT_TIMEOUT" apt-get -y -q -o DPkg::Lock::Timeout=120)
  export DEBIAN_FRONTEND=noninteractive
  if ! "${apt[@]}" install --no-install-recommends "${missing[@]}" >&2; then
    log "install failed; running apt-get update and retrying"
    { "${apt[@]}" update >&2 &&
      "${apt[@]}" install --no-install-recommends "${missing[@]}" >&2; } || rc=$?
  fi
  ((made_policy)) && rm -f /usr/sbin/policy-rc.d
  ((rc == 0)) || die "apt-get install ${missing[*]} failed (rc=$rc)"
}

# ---------------------------------------------------------------- output ----
# emit_env SERVICE NAME=VALUE...: print `export NAME=VALUE` lines on stdout
# and keep a copy in $E3P_INFRA_DIR/SERVICE.env (tests may source it).
emit_env() {
  local service=$1 kv out=""
  shift
  for kv in "E3P_INFRA_DIR=$E3P_INFRA_DIR" "$@"; do
    out+=$(printf 'export %s=%q' "${kv%%=*}" "${kv#*=}")$'\n'
  done
  printf '%s' "$out" >"$E3P_INFRA_DIR/$service.env"
  printf '%s' "$out"
}

# A TCP port on 127.0.0.1 that nothing listens on right now.
free_port() {
  local p _
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 40000))
    [ -z "$(ss -Hltn "sport = :$p" 2>/dev/null)" ] && { echo "$p"; return 0; }
  done
  return 1
}
