#!/usr/bin/env bash
# sshd_up.sh -- a private OpenSSH server for the distributed.SSHCluster tests:
# listens on 127.0.0.1 only, key-only login as root, own config and keys.
# Nothing under /etc/ssh or ~/.ssh is touched.  Root, no systemd.
#
#   port     $E3P_SSH_PORT if set; else the port used last time (if our sshd
#            still has it or it is free); else a free port picked at random
#   state    $E3P_INFRA_DIR/ssh/: sshd_config, host key, client key id_ed25519
#            (no passphrase), authorized_keys, known_hosts, sshd.pid, sshd.log
#
# Idempotent: our sshd keeps running if its config is unchanged; otherwise it
# is restarted.  Done when `ssh -i <key> root@127.0.0.1 true` works.
# Stdout: export lines only (E3P_SSH_HOST/PORT/USER/KEY/KNOWN_HOSTS).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
E3P_TAG=sshd_up
# shellcheck source=lib.sh
. "$HERE/lib.sh"

STATE=$E3P_INFRA_DIR/ssh
KEY=$STATE/id_ed25519

install() {
  ensure_packages openssh-server openssh-client
  log "packages ready ($(elapsed) s)"
}

make_keys() {
  mkdir -p "$STATE" /run/sshd # /run/sshd: privilege separation dir, sshd insists on it
  chmod 700 "$STATE"
  chmod 755 /run/sshd
  [ -f "$STATE/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C e3p-host -f "$STATE/ssh_host_ed25519_key"
  [ -f "$KEY" ] || ssh-keygen -q -t ed25519 -N '' -C e3p-test -f "$KEY"
  cp "$KEY.pub" "$STATE/authorized_keys"
  chmod 600 "$STATE/authorized_keys"
}

port_busy() { [ -n "$(ss -Hltn "sport = :$1" 2>/dev/null)" ]; }

choose_port() {
  if [ -n "${E3P_SSH_PORT:-}" ]; then
    PORT=$E3P_SSH_PORT
    if port_busy "$PORT" && ! { pidfile_alive "$STATE/sshd.pid" sshd && [ "$(cat "$STATE/port" 2>/dev/null)" = "$PORT" ]; }; then
      die "E3P_SSH_PORT=$PORT is already in use by another process"
    fi
  elif [ -s "$STATE/port" ] && { pidfile_alive "$STATE/sshd.pid" sshd || ! port_busy "$(cat "$STATE/port")"; }; then
    PORT=$(cat "$STATE/port") # ours, or still free: keep the port stable
  else
    PORT=$(free_port) || die "no free port found"
  fi
}

# Returns 0 if the config file changed (then sshd must be (re)started).
write_config() {
  local tmp
  tmp=$(mktemp)
  cat >"$tmp" <<EOF
# Written by tests/infra/sshd_up.sh: loopback only, key only, root allowed.
ListenAddress 127.0.0.1
Port $PORT
HostKey $STATE/ssh_host_ed25519_key
PidFile $STATE/sshd.pid
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
UseDNS no
# SSHCluster opens one connection per worker at once
MaxStartups 100:30:200
MaxSessions 100
Subsystem sftp /usr/lib/openssh/sftp-server
EOF
  if cmp -s "$tmp" "$STATE/sshd_config"; then
    rm -f "$tmp"
    return 1
  fi
  mv "$tmp" "$STATE/sshd_config"
  return 0
}

ssh_ok() {
  ssh -p "$PORT" -i "$KEY" -o BatchMode=yes -o ConnectTimeout=5 \
    -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$STATE/known_hosts" \
    -o LogLevel=ERROR root@127.0.0.1 true
}

start_sshd() {
  local changed=0
  write_config && changed=1
  # known_hosts entry for our host key on this port, for tests that verify it
  echo "[127.0.0.1]:$PORT $(cut -d' ' -f1,2 "$STATE/ssh_host_ed25519_key.pub")" >"$STATE/known_hosts"
  if ((changed == 0)) && pidfile_alive "$STATE/sshd.pid" sshd; then
    log "sshd already running on 127.0.0.1:$PORT"
  else
    stop_pidfile "$STATE/sshd.pid" sshd
    /usr/sbin/sshd -t -f "$STATE/sshd_config" || die "bad sshd_config"
    # sshd needs its absolute path (it re-executes itself); it forks and
    # writes PidFile itself.
    spawn "$STATE/sshd.log" /usr/sbin/sshd -f "$STATE/sshd_config" -E "$STATE/sshd.log"
    # sshd may exit 0 and fail afterwards (e.g. bind error): wait for the pid file
    wait_until 10 pidfile_alive "$STATE/sshd.pid" sshd ||
      die "sshd did not start: $(tail -n 2 "$STATE/sshd.log" | tr '\n' ' ')"
    echo "$PORT" >"$STATE/port"
    log "sshd started on 127.0.0.1:$PORT ($(elapsed) s)"
  fi
  wait_until "$E3P_WAIT_S" ssh_ok || die "ssh to 127.0.0.1:$PORT does not work (see $STATE/sshd.log)"
  log "ssh root@127.0.0.1 -p $PORT works ($(elapsed) s)"
}

main() {
  lock_service ssh
  install
  make_keys
  choose_port
  start_sshd
  log "ready in $(elapsed) s"
  emit_env ssh "E3P_SSH_HOST=127.0.0.1" "E3P_SSH_PORT=$PORT" "E3P_SSH_USER=root" \
    "E3P_SSH_KEY=$KEY" "E3P_SSH_KNOWN_HOSTS=$STATE/known_hosts"
}

main "$@"
