"""The Prefect server process: a free port, Prefect's server app run by
:mod:`espnet3_prefect.server.serve` (HTTP or HTTPS) started and waited for until healthy, recorded in the per-user
registry (:func:`~espnet3_prefect.server.state_home.registry_dir`, read by
:mod:`espnet3_prefect.server.registry`), and stopped by its process group. Which server a run uses,
and when it stops, is :mod:`espnet3_prefect.server.embedded`'s business.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from espnet3_prefect._internal.atomic import atomic_write_text
from espnet3_prefect._internal.proc import pid_alive, stop_group
from espnet3_prefect._internal.stopping import SERVER_STOP
from espnet3_prefect._internal.util import read_json
from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.server.services import service_environ
from espnet3_prefect.server.state_home import PREFECT_HOME_DIR, registry_dir

if TYPE_CHECKING:
    from espnet3_prefect.server.https import ServerTLS
    from espnet3_prefect.server.postgres import Database

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


#: a path no route answers: matching it walks every router once (see :func:`warm_routes`)
WARM_UP_PATH = "/espnet3-prefect-warm-up"


def warm_routes(api_url: str, cafile: str | None = None, auth_string: str | None = None) -> threading.Thread:
    """Ask the server, from a background thread, for a path no route answers (404), so that it
    prepares every route now rather than on the run's first requests.

    FastAPI prepares a router's routes (their dependencies and parameter models) the first time a
    request is matched against that router: ~0.9 s of the server's CPU, paid by whichever request
    comes first. A 404 is matched against all of them. Sent right after the server is healthy, this
    overlaps with the caller's own start (loading the config, importing the flows) instead of
    delaying the run's first API call. It only warms: whatever the answer, or none, it says nothing
    (the returned thread's ``status`` holds the HTTP status once it has one: 404 when it got through).
    """
    from espnet3_prefect.server.https import client_context

    request = urllib.request.Request(api_url + WARM_UP_PATH)
    if auth_string:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth_string.encode()).decode())
    context = client_context(cafile) if api_url.startswith("https://") else None

    def ask() -> None:
        try:
            with urllib.request.urlopen(request, timeout=60, context=context) as resp:
                thread.status = resp.status
        except urllib.error.HTTPError as exc:  # the 404 expected
            thread.status = exc.code
        except Exception:  # a server stopped meanwhile: nothing to report
            pass

    thread = threading.Thread(target=ask, name="espnet3-prefect-warm-routes", daemon=True)
    thread.status = None
    thread.start()
    return thread


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
    guard_parent: int | None = None,
    database: Database | None = None,
    extra_env: dict[str, str] | None = None,
    api_processes: int = 1,
) -> tuple[subprocess.Popen, str]:
    """Start Prefect's server (:mod:`espnet3_prefect.server.serve`: the app ``prefect server start``
    runs, with a stop that drains the services' queues) on ``host`` (an address) and wait until it is
    healthy; with ``auth_string`` the API asks for basic auth (handed over in the environment, never
    on argv); with ``tls`` (its files made) it serves HTTPS (the files by path).
    ``services``: ``"all"`` (deployments, schedules) or ``"run"``, what a CLI run uses (:mod:`.services`).
    ``guard_parent``: the pid of the run the server must not outlive (a server that is not kept): it
    is started under :mod:`~espnet3_prefect.server.guard`, whose pid is the one returned, recorded
    and stopped (:func:`stop_server` stops both), and which stops the server once that run has died
    and no other run records itself as a user in ``home/users``. ``database``: a PostgreSQL
    (:mod:`~espnet3_prefect.server.postgres`; its URL and password file in the environment, never the
    password); default SQLite in ``home``.
    ``extra_env``: more variables for the server (a database URL, Redis; secrets go here, never on
    argv). ``services="none"``: the API only (``--no-services``), its services run elsewhere
    (:mod:`.split`); ``api_processes`` > 1 runs that many API processes on the one port (``--workers``:
    PostgreSQL and Redis messaging only, Prefect refuses it otherwise)."""
    if api_processes < 1:
        raise Espnet3PrefectError(f"api_processes: {api_processes} is not a positive number")
    if api_processes > 1 and services != "none":
        raise Espnet3PrefectError("api_processes > 1 needs services='none' (their services run apart, .split)")
    if services == "none" and tls is not None:
        raise Espnet3PrefectError("an API without services is served over HTTP only (TLS: one process, services in it)")
    from espnet3_prefect.server.host import url_host

    port = port or free_port(host)
    api_url = f"{'https' if tls else 'http'}://{url_host(host)}:{port}/api"
    # The UI asks GET /ui-settings where its API is. Prefect answers PREFECT_UI_API_URL, whose default
    # is built from PREFECT_SERVER_API_PORT (4200), not from --port: without this the UI of a server on
    # any other port is blank, or shows the runs of whichever server holds 4200.
    env = {
        **os.environ,
        "PREFECT_HOME": str(home / PREFECT_HOME_DIR),
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
    if database is not None:
        env.update(database.server_environ())
    env.update(extra_env or {})
    if services == "none" or api_processes > 1:
        # the split server's API processes (:mod:`.split`): Prefect's own start runs N of them and no
        # services, so there is no services' queue of theirs to drain (Redis holds the messages)
        cmd = [prefect_executable(), "server", "start", "--host", host, "--port", str(port)]
        if services == "none":
            cmd.append("--no-services")
        if api_processes > 1:
            cmd += ["--workers", str(api_processes)]
    else:
        # our launcher of Prefect's app, not `prefect server start`: HTTPS when asked, and a stop that lets
        # the services write what they hold first (:mod:`espnet3_prefect.server.serve`)
        cmd = [sys.executable, "-m", "espnet3_prefect.server.serve", "--host", host, "--port", str(port)]
    if tls is not None:
        cmd += ["--ssl-certfile", str(tls.cert_file), "--ssl-keyfile", str(tls.key_file)]
    log.info("starting Prefect server: %s", " ".join(cmd))
    if guard_parent is not None:
        cmd = [*guard_command(guard_parent, home, api_url), "--", *cmd]
    logfile = open(home / "server.log", "ab")
    proc = subprocess.Popen(
        cmd, env=env, stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    logfile.close()
    cafile = str(tls.ca_file) if tls else None
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (home / "server.log").read_text(errors="replace")[-1500:]
            raise Espnet3PrefectError(
                f"Prefect server exited with code {proc.returncode}; log {home / 'server.log'}: "
                f"{' '.join(tail.split()[-60:])}"
            )
        if healthy(api_url, cafile=cafile):
            warm_routes(api_url, cafile, auth_string)
            _register(
                proc.pid,
                api_url,
                home,
                ui,
                auth=bool(auth_string),
                ca_file=cafile,
                services=services,
                run_pid=guard_parent,
                database=database.url if database is not None else None,
            )
            return proc, api_url
        time.sleep(0.5)
    stop_server(proc.pid)
    raise Espnet3PrefectError(
        f"Prefect server did not become healthy in {STARTUP_TIMEOUT_S} s; see {home / 'server.log'}"
    )


def guard_command(parent: int, home: Path, api_url: str) -> list[str]:
    """The :mod:`~espnet3_prefect.server.guard` of a server that must not outlive ``parent`` (run as a
    script in isolated mode: it imports only the standard library, never the package or Prefect)."""
    from espnet3_prefect.server import guard

    return [
        sys.executable,
        "-I",
        guard.__file__,
        "--parent",
        str(parent),
        "--home",
        str(home),
        "--api-url",
        api_url,
        "--registry",
        str(registry_dir()),
    ]


#: how long a server may take to stop on SIGTERM (its drain and its guard's grace included: :mod:`.serve`,
#: :mod:`.guard`; :data:`~espnet3_prefect._internal.stopping.SERVER_STOP` keeps them in order) before SIGKILL
STOP_TIMEOUT_S = SERVER_STOP.stop_s


def stop_server(pid: int, timeout_s: float = STOP_TIMEOUT_S) -> None:
    """Stop the server process group started by :func:`start_server`: SIGTERM, which both the server
    (uvicorn: a graceful shutdown, which first drains the services' queues: :mod:`.serve`) and its
    guard (which tells the server so and waits for it) stop on, then SIGKILL after ``timeout_s``."""
    try:
        stop_group(pid, timeout_s)
    finally:
        (registry_dir() / f"{pid}.json").unlink(missing_ok=True)


def _register(
    pid: int,
    api_url: str,
    home: Path,
    ui: bool,
    auth: bool = False,
    ca_file: str | None = None,
    services: str = "all",
    run_pid: int | None = None,
    database: str | None = None,
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
        "run_pid": run_pid,  # the run it stops with (its guard's parent); None: a server left running on purpose
        "database": database,  # a PostgreSQL URL (never with a password); None: SQLite in state_dir
        "create_time": _create_time(pid),  # the process's own start: a recycled pid has another one
    }
    try:
        registry_dir().mkdir(parents=True, exist_ok=True)
        atomic_write_text(registry_dir() / f"{pid}.json", json.dumps(record))
    except OSError as exc:  # a run does not fail for it; only `servers` will not list this one
        log.warning("could not record the Prefect server in %s: %s", registry_dir(), exc)


def _create_time(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


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


def forget_server(home: Path, pid: int, api_url: str) -> None:
    """After the server ``pid`` of ``home`` stopped: its record, its client file (the credential is
    worth nothing now; no stale secret left on disk) and its certificate folder go."""
    from espnet3_prefect.disk.client_file import client_file
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
