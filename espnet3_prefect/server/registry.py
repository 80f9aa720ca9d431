"""The Prefect servers espnet3-prefect started and left running (``--keep-server``, ``deploy-local``):
read from the per-user registry :func:`espnet3_prefect.server.state_home.registry_dir` (where
:func:`~espnet3_prefect.server.process.start_server` records each one), listed, found by pid, URL or state
dir, and stopped (``espnet3-prefect servers``). Moved out of ``server/embedded.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import urllib.parse
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import NamedTuple

import psutil

from espnet3_prefect._internal.proc import pid_alive, started_by, stop_tree
from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.server.drain import drain_server
from espnet3_prefect.server.process import forget_server, healthy, stop_server
from espnet3_prefect.server.state_home import registry_dir

#: what a ``prefect worker start`` stops on: SIGINT (it takes no new flow run, then exits); Prefect
#: maps a first SIGTERM to it as well, but a second SIGTERM to SIGKILL of itself
WORKER_STOP_SIGNAL = signal.SIGINT


def stop_worker(pid: int, timeout_s: float = 15) -> bool:
    """Stop deploy-local's process worker and the flow runs it started (:func:`stop_tree`): the worker
    told :data:`WORKER_STOP_SIGNAL`, its flow runs (each in a session of its own, which it would
    otherwise wait for) SIGTERM at the same time; killed only after ``timeout_s``."""
    return stop_tree(pid, timeout_s, first=WORKER_STOP_SIGNAL)


@dataclass(frozen=True)
class ServerRecord:
    """A Prefect server started by espnet3-prefect that is still running."""

    pid: int
    api_url: str
    started: str  # ISO 8601 with the UTC offset, to the second
    state_dir: str
    ui: bool = True
    worker_pid: int | None = None  # deploy-local's process worker, when this is deploy-local's server
    ssl_cert_file: str | None = None  # what its https:// API is verified with (server/https.py ServerTLS.ca_file)
    services: str = "all"  # "run": started by a run for itself, not kept (no deployment scheduler)
    run_pid: int | None = None  # the run it stops with (its guard's parent), when it has a guard

    @property
    def ui_url(self) -> str:
        return self.api_url[: -len("/api")] if self.api_url.endswith("/api") else self.api_url

    @property
    def stop_command(self) -> str:
        return f"espnet3-prefect servers --stop {self.ui_url}"

    def users(self) -> list[int]:
        """Live espnet3-prefect processes using this server now (not the server, not this process)."""
        users = Path(self.state_dir) / "users"
        pids = [int(p.name) for p in users.glob("*") if p.name.isdigit()] if users.is_dir() else []
        return sorted(p for p in pids if p not in (self.pid, os.getpid()) and pid_alive(p))

    def left_over(self) -> bool:
        """A run's own server (not kept) that nothing uses any more: its run is gone (killed before it
        could stop it, or started before servers had a guard) and no other run records itself as a
        user. A guarded one is stopped by its guard within seconds; this one was not."""
        return self.services == "run" and not (self.run_pid and pid_alive(self.run_pid)) and not self.users()

    def answers(self, timeout_s: float = 2.0) -> bool:
        return healthy(self.api_url, timeout_s, cafile=self.ssl_cert_file)


def _is_prefect_server(pid: int, data: dict) -> bool:
    """Alive, and still the process its record ``data`` names, not a recycled pid: started by the
    record's ``create_time`` when it has one, else (older records) by the time it was written and a
    ``prefect`` process (its command line says so, where it may be read)."""
    if not isinstance(pid, int) or not pid_alive(pid):
        return False
    if isinstance(data.get("create_time"), (int, float)):
        return started_by(pid, data["create_time"])
    with contextlib.suppress(ValueError, TypeError):
        if not started_by(pid, datetime.fromisoformat(data.get("started")).timestamp()):
            return False
    try:
        return any("prefect" in part for part in psutil.Process(pid).cmdline())
    except psutil.AccessDenied:
        return True
    except psutil.NoSuchProcess:
        return False


def _deploy_worker(home: Path, pid: int) -> int | None:
    try:
        state = json.loads((home / "deploy-local.json").read_text())
    except (OSError, ValueError):
        return None
    worker = state.get("worker_pid")
    return worker if state.get("server_pid") == pid and isinstance(worker, int) and pid_alive(worker) else None


def list_servers() -> list[ServerRecord]:
    """The servers we started that still run, oldest first; records of gone ones are removed."""
    found = []
    for entry in registry_dir().glob("*.json") if registry_dir().is_dir() else []:
        try:
            data = json.loads(entry.read_text())
            pid = int(data["pid"])
            fields = {
                "pid": pid,
                "api_url": str(data["api_url"]),
                "started": str(data.get("started", "")),
                "state_dir": str(data.get("state_dir", "")),
                "ui": bool(data.get("ui", True)),
                "ssl_cert_file": data.get("ssl_cert_file") or None,
                "services": str(data.get("services", "all")),
                "run_pid": int(data["run_pid"]) if data.get("run_pid") else None,
            }
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours to judge; never deleted
        if not _is_prefect_server(pid, data):
            entry.unlink(missing_ok=True)
            continue
        found.append(ServerRecord(**fields, worker_pid=_deploy_worker(Path(fields["state_dir"]), pid)))
    return sorted(found, key=lambda r: (r.started, r.pid))


def find_servers(target: str, servers: list[ServerRecord] | None = None) -> list[ServerRecord]:
    """The running servers ``target`` names: ``all``, a pid, any URL on the server (its UI, its API,
    a flow-run page, ``127.0.0.1:4200``) or its state dir."""
    servers = list_servers() if servers is None else servers
    target = target.strip()
    if target == "all":
        return servers
    if target.isdigit():
        return [s for s in servers if s.pid == int(target)]
    if "://" not in target and Path(target).expanduser().is_dir():
        wanted = Path(target).expanduser().resolve()
        return [s for s in servers if Path(s.state_dir) == wanted]
    netloc = urllib.parse.urlsplit(target if "://" in target else f"http://{target}").netloc.lower()
    aliases = {netloc, netloc.replace("localhost", "127.0.0.1")}
    return [s for s in servers if urllib.parse.urlsplit(s.api_url).netloc.lower() in aliases]


class StopOutcome(NamedTuple):
    stopped: list[ServerRecord]
    busy: list[ServerRecord]  # still used by a running espnet3-prefect process; left alone (force=False)


def stop_servers(target: str, *, force: bool = False, timeout_s: float = 30) -> StopOutcome:
    """Stop the servers :func:`find_servers` finds for ``target``, with deploy-local's worker (and the
    flow runs it started) and private PostgreSQL when it is deploy-local's server. A server another
    espnet3-prefect process is using is left running unless ``force``."""
    stopped, busy = [], []
    for server in find_servers(target):
        if server.users() and not force:
            busy.append(server)
            continue
        if server.worker_pid:
            stop_worker(server.worker_pid, timeout_s)
        # what the recorder has not written yet lives in the server's memory: let it catch up first
        drain_server(server.state_dir, server.api_url, server.ssl_cert_file)
        stop_server(server.pid, timeout_s)
        cluster = _deploy_postgres(Path(server.state_dir), server.pid)
        _forget(server)
        if cluster:  # deploy-local's private PostgreSQL, once the server that wrote to it is gone
            from espnet3_prefect.server.postgres import STATE_SUBDIR, running_postgres, stop_postgres

            running = running_postgres(Path(server.state_dir) / STATE_SUBDIR)
            if running is not None and running.pid == cluster:  # still that cluster, not a reused pid
                stop_postgres(cluster)
        stopped.append(server)
    return StopOutcome(stopped, busy)


def _deploy_postgres(home: Path, server_pid: int) -> int | None:
    """The pid of the private PostgreSQL ``deploy-local`` started with server ``server_pid``, if any."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        state = json.loads((home / "deploy-local.json").read_text())
        if state.get("server_pid") == server_pid:
            return state.get("postgres_pid")
    return None


def _forget(server: ServerRecord) -> None:
    """Remove what the state dir says about a server that is gone (its credential and certificate too)."""
    home = Path(server.state_dir)
    (home / "users" / str(server.pid)).unlink(missing_ok=True)
    with contextlib.suppress(OSError, ValueError):
        if json.loads((home / "deploy-local.json").read_text()).get("server_pid") == server.pid:
            (home / "deploy-local.json").unlink(missing_ok=True)
    forget_server(home, server.pid, server.api_url)


def kept_server_message(server: ServerRecord) -> str:
    """What the CLI prints when it leaves a server running (``--keep-server``)."""
    return (
        f"Prefect server left running (pid {server.pid}, state {server.state_dir}):\n"
        f"  UI:   {server.ui_url}\n"
        f"  stop: {server.stop_command}"
    )


def left_over_note(server: ServerRecord) -> str:
    run = f" (pid {server.run_pid})" if server.run_pid else ""
    return f"left over: the run that started it{run} is gone and nothing uses it"


def report_left_over(skip_state_dir: Path | None = None) -> list[ServerRecord]:
    """The servers :meth:`ServerRecord.left_over` finds (but those of ``skip_state_dir``, which the
    caller reuses), each logged as a warning with the command that stops it; returned."""
    import logging

    found = [
        s
        for s in list_servers()
        if s.left_over() and (skip_state_dir is None or Path(s.state_dir) != Path(skip_state_dir))
    ]
    for server in found:
        logging.getLogger("espnet3_prefect").warning(
            "a Prefect server an earlier run left running: %s (pid %s, state %s), %s; stop it: %s",
            server.ui_url,
            server.pid,
            server.state_dir,
            left_over_note(server),
            server.stop_command,
        )
    return found


def format_servers(servers: list[ServerRecord]) -> str:
    """The table ``espnet3-prefect servers`` prints."""
    if not servers:
        return f"no espnet3-prefect Prefect server is running (records: {registry_dir()})"
    rows = [("PID", "UI", "STARTED", "STATE DIR", "")]
    for s in servers:
        note = f"deploy-local, worker pid {s.worker_pid}" if s.worker_pid else ("" if s.ui else "no UI")
        users = s.users()
        if users:
            note = ", ".join(filter(None, [note, "in use by pid " + " ".join(map(str, users))]))
        elif s.left_over():
            note = ", ".join(filter(None, [note, left_over_note(s)]))
        rows.append((str(s.pid), s.ui_url, s.started.replace("T", " ")[:19], s.state_dir, note))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + (f"  ({r[4]})" if r[4] else "") for r in rows]
    lines[0] = lines[0].rstrip()
    return "\n".join(lines) + "\nstop one: espnet3-prefect servers --stop <UI URL or pid>; all: --stop all"


def find_api(state: str | None):
    """The :class:`~espnet3_prefect.disk.client_file.ClientCredentials` to talk to: ``$PREFECT_API_URL`` (with
    ``$PREFECT_API_AUTH_STRING`` and ``$PREFECT_API_SSL_CERT_FILE``), else the server ``deploy-local``
    (or ``--keep-server``) left running (with its client file's credential and certificate when it has them)."""
    from espnet3_prefect.disk.client_file import ClientCredentials
    from espnet3_prefect.server.auth import server_client
    from espnet3_prefect.server.process import running_server
    from espnet3_prefect.server.state_home import state_dir

    url = os.environ.get("PREFECT_API_URL")
    if url:
        cert = os.environ.get("PREFECT_API_SSL_CERT_FILE") or None
        if not healthy(url, cafile=cert):
            raise Espnet3PrefectError(f"PREFECT_API_URL={url} does not answer")
        return ClientCredentials(
            url,
            os.environ.get("PREFECT_API_AUTH_STRING") or None,
            os.environ.get("PREFECT_API_KEY") or None,
            ssl_cert_file=cert,
        )
    home = state_dir(state)
    info = running_server(home)
    if info is None:
        raise Espnet3PrefectError(
            "no Prefect server to submit to: run `espnet3-prefect deploy-local` "
            "(or set PREFECT_API_URL to a server with the deployments)"
        )
    return server_client(home, info, wanted_host=None, wanted_auth=False)
