"""The embedded default: one Prefect server on 127.0.0.1, shared by the flow and every Dask worker.

Without ``PREFECT_API_URL`` each process that runs a Prefect task would start its own temporary
server on one SQLite file (slow, "database is locked"). :func:`prefect_api` instead starts one
server (or reuses the one a concurrent run started), exports its URL so that Dask workers and
batch jobs inherit it, and stops it when the last user leaves. Beyond loopback it asks for basic
auth (:mod:`~espnet3_prefect.server.auth`) and serves HTTPS with a certificate made for that start
(:mod:`~espnet3_prefect.server.https`, launched by :mod:`~espnet3_prefect.server.serve`).

State (database, logs, pids) lives in a per-project folder (:func:`state_dir`): the default is
``<project>/.e3p/prefect``, where ``<project>`` is the git checkout the command runs in (else the
current folder), so the UI of one project never shows another project's runs. Every server
started here is also recorded in a per-user registry (:func:`registry_dir`), so the servers left
running (``--keep-server``, ``deploy-local``) can be listed and stopped from anywhere
(:func:`~espnet3_prefect.server.registry.list_servers`, :func:`~espnet3_prefect.server.registry.stop_servers`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from espnet3_prefect._internal.atomic import atomic_write_text
from espnet3_prefect._internal.proc import pid_alive, stop_group
from espnet3_prefect._internal.util import read_json
from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.server.port import project_port, remember_port
from espnet3_prefect.server.services import service_environ
from espnet3_prefect.server.state_home import (  # noqa: F401
    DEFAULT_STATE_DIR,
    STATE_DIR_HELP,
    default_state_dir,
    project_folder,
    registry_dir,
    state_dir,
)

if TYPE_CHECKING:
    from espnet3_prefect.server.https import ServerTLS

log = logging.getLogger("espnet3_prefect")
STARTUP_TIMEOUT_S = 180


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` (an address) right now."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def healthy(api_url: str, timeout_s: float = 2.0, cafile: str | None = None) -> bool:
    """True when the Prefect API at ``api_url`` answers its health check (``https://``: verified with
    ``cafile``, else the system's authorities)."""
    from espnet3_prefect.server.https import client_context

    context = client_context(cafile) if api_url.startswith("https://") else None
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout_s, context=context) as resp:
            return resp.status == 200
    except OSError:
        return False


def prefect_executable() -> str:
    """The ``prefect`` command installed next to this Python (else the one on PATH)."""
    beside = Path(sys.executable).with_name("prefect")
    found = str(beside) if beside.exists() else shutil.which("prefect")
    if not found:
        raise Espnet3PrefectError("the 'prefect' command is not installed next to this Python")
    return found


def start_server(
    home: Path,
    port: int | None = None,
    ui: bool = True,
    *,
    host: str = "127.0.0.1",
    auth_string: str | None = None,
    tls: ServerTLS | None = None,
    services: str = "all",
) -> tuple[subprocess.Popen, str]:
    """Start ``prefect server start`` on ``host`` (an address) and wait until it is healthy; with
    ``auth_string`` the API asks for basic auth (handed over in the environment, never on argv); with
    ``tls`` (its files made) it serves HTTPS (:mod:`espnet3_prefect.server.serve`, the files by path).
    ``services``: ``"all"`` (deployments, schedules) or ``"run"``, what a CLI run uses (:mod:`.server_services`)."""
    from espnet3_prefect.server.host import url_host

    port = port or free_port(host)
    api_url = f"{'https' if tls else 'http'}://{url_host(host)}:{port}/api"
    # The UI asks GET /ui-settings where its API is. Prefect answers PREFECT_UI_API_URL, whose default
    # is built from PREFECT_SERVER_API_PORT (4200), not from --port: without this the UI of a server on
    # any other port is blank, or shows the runs of whichever server holds 4200.
    env = {
        **os.environ,
        "PREFECT_HOME": str(home / "prefect_home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "true" if ui else "false",
        "PREFECT_SERVER_UI_API_URL": api_url,
        # what turns a checkpoint event into an evaluate run: kept on whatever the shell says
        "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED": "true",
        "PREFECT_SERVER_SERVICES_TRIGGERS_ENABLED": "true",
        "PREFECT_SERVER_SERVICES_ACTIONS_ENABLED": "true",
        # `prefect deployment run --watch` shows a run's log lines (ours say why a run failed) only
        # when the server streams them out (off by default)
        "PREFECT_SERVER_LOGS_STREAM_OUT_ENABLED": "true",
        "PREFECT_SERVER_LOGS_STREAM_PUBLISHING_ENABLED": "true",
    }
    for inherited in ("PREFECT_API_URL", "PREFECT_UI_API_URL", "PREFECT_SERVER_API_AUTH_STRING"):
        env.pop(inherited, None)
    if auth_string:
        env["PREFECT_SERVER_API_AUTH_STRING"] = auth_string
    env.update(service_environ(services, env))
    cmd = [prefect_executable(), "server", "start", "--host", host, "--port", str(port)]
    if tls is not None:
        cmd = [
            sys.executable,
            "-m",
            "espnet3_prefect.server.serve",
            "--host",
            host,
            "--port",
            str(port),
            "--ssl-certfile",
            str(tls.cert_file),
            "--ssl-keyfile",
            str(tls.key_file),
        ]
    log.info("starting Prefect server: %s", " ".join(cmd))
    logfile = open(home / "server.log", "ab")
    proc = subprocess.Popen(
        cmd, env=env, stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    logfile.close()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (home / "server.log").read_text(errors="replace")[-1500:]
            raise Espnet3PrefectError(
                f"Prefect server exited with code {proc.returncode}; log {home / 'server.log'}: "
                f"{' '.join(tail.split()[-60:])}"
            )
        if healthy(api_url, cafile=str(tls.ca_file) if tls else None):
            _register(
                proc.pid,
                api_url,
                home,
                ui,
                auth=bool(auth_string),
                ca_file=str(tls.ca_file) if tls else None,
                services=services,
            )
            return proc, api_url
        time.sleep(0.5)
    stop_server(proc.pid)
    raise Espnet3PrefectError(
        f"Prefect server did not become healthy in {STARTUP_TIMEOUT_S} s; see {home / 'server.log'}"
    )


def stop_server(pid: int, timeout_s: float = 20) -> None:
    """Stop the server process group started by :func:`start_server` (TERM, then KILL)."""
    try:
        stop_group(pid, timeout_s)
    finally:
        (registry_dir() / f"{pid}.json").unlink(missing_ok=True)


def running_server(home: Path) -> dict | None:
    """``{"pid", "api_url", "ui_url"}`` of the server recorded in ``home`` while it is alive and healthy."""
    info = read_json(home / "server.json")
    if (
        isinstance(info, dict)
        and pid_alive(info.get("pid", -1))
        and healthy(info.get("api_url", ""), cafile=info.get("ssl_cert_file"))
    ):
        return info
    return None


def _other_users(home: Path) -> list[int]:
    users = home / "users"
    pids = []
    for entry in users.glob("*") if users.exists() else []:
        pid = int(entry.name) if entry.name.isdigit() else -1
        if pid != os.getpid() and pid_alive(pid):
            pids.append(pid)
        elif pid != os.getpid():
            entry.unlink(missing_ok=True)
    return pids


@contextlib.contextmanager
def prefect_api(
    home: str | Path | None = None,
    *,
    keep: bool = False,
    ui: bool = True,
    host: str | None = None,
    auth: bool | None = None,
    tls: bool | None = None,
) -> Iterator[str]:
    """Yield a Prefect API URL: ``$PREFECT_API_URL``, else a running embedded server, else a new one.

    The URL is exported in ``os.environ`` (Dask workers and batch jobs inherit it) and set in
    Prefect's settings for this process. A server started here is stopped on exit unless
    ``keep`` is set or another run still uses it; one that is not kept runs only the services a run
    uses (``services="run"`` of :func:`start_server`). ``host`` (default ``$ESPNET3_PREFECT_SERVER_HOST``,
    else 127.0.0.1): where a new server listens; off loopback it asks for basic auth (``auth``: force
    it on loopback too; ``False`` off loopback is refused), see :mod:`espnet3_prefect.server.auth`, and
    serves HTTPS (``tls``: force it on loopback too, ``False``: plain HTTP), see :mod:`espnet3_prefect.server.https`.

    >>> with prefect_api("/tmp/e3p-doc") as url:   # doctest: +SKIP
    ...     print(url)
    http://127.0.0.1:41231/api
    """
    from espnet3_prefect.server.auth import exported, external_client, server_client
    from espnet3_prefect.server.host import HOST_VAR, auth_required, resolve_host, tls_required

    chosen_host = host or os.environ.get(HOST_VAR)
    if os.environ.get("PREFECT_API_URL"):
        asked = (
            f"--server-host {host}" if host else "--server-tls" if tls else "--no-server-tls" if tls is False else ""
        )
        if asked:
            raise Espnet3PrefectError(
                f"{asked}: PREFECT_API_URL is set, so no embedded server starts; unset it or drop {asked.split()[0]}"
            )
        with exported(external_client(lambda: state_dir(home))):
            yield os.environ["PREFECT_API_URL"]
        return
    address = resolve_host(chosen_host) if chosen_host else "127.0.0.1"
    with_tls = tls_required(address, tls, auth)
    with_auth = auth_required(address, auth)
    home = state_dir(home)
    (home / "users").mkdir(exist_ok=True)
    me = home / "users" / str(os.getpid())
    me.touch()
    try:
        info = running_server(home)
        if info is None:
            info = start_recorded(
                home,
                ui=ui,
                host=address,
                auth=with_auth,
                tls=with_tls,
                given_host=chosen_host,
                services="all" if keep else "run",
            )
        creds = server_client(
            home, info, wanted_host=address if chosen_host else None, wanted_auth=with_auth, wanted_tls=with_tls
        )
    except BaseException:
        me.unlink(missing_ok=True)
        raise
    try:
        with exported(creds, home):
            yield info["api_url"]
    finally:
        me.unlink(missing_ok=True)
        if not keep and not _other_users(home):
            _flush_prefect()
            stop_server(info["pid"])
            forget_server(home, info["pid"], info["api_url"])


def start_recorded(
    home: Path,
    *,
    ui: bool,
    host: str = "127.0.0.1",
    auth: bool = False,
    port: int | None = None,
    tls: bool = False,
    given_host: str | None = None,
    services: str = "all",
) -> dict:
    """Start a server for ``home`` (with a new credential when ``auth``, serving HTTPS with a new
    certificate naming ``host`` and ``given_host`` when ``tls``, running ``services``), write its 0600
    client file (when ``auth`` or ``tls``) and record it in ``home/server.json``; return that record."""
    from espnet3_prefect.server.auth import ClientCredentials, client_file, new_auth_string, write_client_file
    from espnet3_prefect.server.https import ServerTLS

    auth_string = new_auth_string() if auth else None
    certs = ServerTLS.of(home).create(host, given_host) if tls else None
    try:
        proc, url = start_server(
            home,
            port=port or project_port(home, host),
            ui=ui,
            host=host,
            auth_string=auth_string,
            tls=certs,
            services=services,
        )
    except BaseException:
        if certs is not None:
            certs.remove()
        raise
    remember_port(home, url)
    info = {
        "pid": proc.pid,
        "api_url": url,
        "ui_url": url[: -len("/api")],
        "host": host,
        "auth": auth,
        "tls": tls,
        "ssl_cert_file": str(certs.ca_file) if certs else None,
        "services": services,
    }
    if auth or tls:
        write_client_file(client_file(home), ClientCredentials(url, auth_string, ssl_cert_file=info["ssl_cert_file"]))
    atomic_write_text(home / "server.json", json.dumps(info))
    return info


def forget_server(home: Path, pid: int, api_url: str) -> None:
    """After the server ``pid`` of ``home`` stopped: its record, its client file (the credential is
    worth nothing now; no stale secret left on disk) and its certificate folder go."""
    from espnet3_prefect.server.auth import client_file
    from espnet3_prefect.server.https import ServerTLS

    record, client = read_json(home / "server.json"), read_json(client_file(home))
    mine = isinstance(record, dict) and record.get("pid") == pid
    if mine:
        (home / "server.json").unlink(missing_ok=True)
    if isinstance(client, dict) and client.get("api_url") == api_url:
        client_file(home).unlink(missing_ok=True)
        mine = mine or bool(client.get("ssl_cert_file"))
    if mine:
        ServerTLS.of(home).remove()


def _flush_prefect() -> None:
    """Send the logs and events still queued in this process before the server goes away."""
    if "prefect" not in sys.modules:
        return
    with contextlib.suppress(Exception):
        from prefect.logging.handlers import APILogHandler

        APILogHandler().flush()
    with contextlib.suppress(Exception):
        from prefect.events.worker import EventsWorker

        EventsWorker.drain_all(timeout=10)


# -- the registry of the servers we started (read by servers.py) -------------------------------


def _register(
    pid: int, api_url: str, home: Path, ui: bool, auth: bool = False, ca_file: str | None = None, services: str = "all"
) -> None:
    record = {
        "pid": pid,
        "api_url": api_url,
        "started": datetime.now().astimezone().isoformat(timespec="seconds"),
        "state_dir": str(home),
        "ui": ui,
        "auth": auth,
        "ssl_cert_file": ca_file,
        "services": services,
    }
    try:
        registry_dir().mkdir(parents=True, exist_ok=True)
        atomic_write_text(registry_dir() / f"{pid}.json", json.dumps(record))
    except OSError as exc:  # a run does not fail for it; only `servers` will not list this one
        log.warning("could not record the Prefect server in %s: %s", registry_dir(), exc)
