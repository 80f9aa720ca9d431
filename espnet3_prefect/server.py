"""The embedded default: one Prefect server on 127.0.0.1, shared by the flow and every Dask worker.

Without ``PREFECT_API_URL`` each process that runs a Prefect task would start its own temporary
server on one SQLite file (slow, "database is locked"). :func:`prefect_api` instead starts one
server (or reuses the one a concurrent run started), exports its URL so that Dask workers and
batch jobs inherit it, and stops it when the last user leaves.
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
from pathlib import Path
from typing import Iterator

from ._proc import pid_alive, stop_group
from .atomic import atomic_write_text
from .errors import Espnet3PrefectError
from .util import read_json

log = logging.getLogger("espnet3_prefect")
DEFAULT_STATE_DIR = "~/.espnet3-prefect"
STARTUP_TIMEOUT_S = 180


def state_dir(path: str | Path | None = None) -> Path:
    """Where the embedded server keeps its database, logs and pid: arg, $ESPNET3_PREFECT_HOME, default."""
    chosen = path or os.environ.get("ESPNET3_PREFECT_HOME") or DEFAULT_STATE_DIR
    out = Path(chosen).expanduser().resolve()
    out.mkdir(parents=True, exist_ok=True)
    return out


def free_port() -> int:
    """A TCP port that is free on 127.0.0.1 right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    """True when the Prefect API at ``api_url`` answers its health check."""
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout_s) as resp:
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


def start_server(home: Path, port: int | None = None, ui: bool = True) -> tuple[subprocess.Popen, str]:
    """Start ``prefect server start`` on 127.0.0.1 and wait until it is healthy."""
    port = port or free_port()
    api_url = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(home / "prefect_home"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_UI_ENABLED": "true" if ui else "false"}
    env.pop("PREFECT_API_URL", None)
    cmd = [prefect_executable(), "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    log.info("starting Prefect server: %s", " ".join(cmd))
    logfile = open(home / "server.log", "ab")
    proc = subprocess.Popen(cmd, env=env, stdout=logfile, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    logfile.close()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            tail = (home / "server.log").read_text(errors="replace")[-1500:]
            raise Espnet3PrefectError(f"Prefect server exited with code {proc.returncode}; log {home/'server.log'}: {' '.join(tail.split()[-60:])}")
        if healthy(api_url):
            return proc, api_url
        time.sleep(0.5)
    stop_server(proc.pid)
    raise Espnet3PrefectError(f"Prefect server did not become healthy in {STARTUP_TIMEOUT_S} s; see {home/'server.log'}")


def stop_server(pid: int, timeout_s: float = 20) -> None:
    """Stop the server process group started by :func:`start_server` (TERM, then KILL)."""
    stop_group(pid, timeout_s)


def running_server(home: Path) -> dict | None:
    """``{"pid", "api_url", "ui_url"}`` of the server recorded in ``home`` while it is alive and healthy."""
    info = read_json(home / "server.json")
    if isinstance(info, dict) and pid_alive(info.get("pid", -1)) and healthy(info.get("api_url", "")):
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
def prefect_api(home: str | Path | None = None, *, keep: bool = False, ui: bool = True) -> Iterator[str]:
    """Yield a Prefect API URL: ``$PREFECT_API_URL``, else a running embedded server, else a new one.

    The URL is exported in ``os.environ`` (Dask workers and batch jobs inherit it) and set in
    Prefect's settings for this process. A server started here is stopped on exit unless
    ``keep`` is set or another run still uses it.

    >>> with prefect_api("/tmp/e3p-doc") as url:   # doctest: +SKIP
    ...     print(url)
    http://127.0.0.1:41231/api
    """
    if os.environ.get("PREFECT_API_URL"):
        yield os.environ["PREFECT_API_URL"]
        return
    home = state_dir(home)
    (home / "users").mkdir(exist_ok=True)
    me = home / "users" / str(os.getpid())
    me.touch()
    info = running_server(home)
    proc = None
    if info is None:
        proc, url = start_server(home, ui=ui)
        info = {"pid": proc.pid, "api_url": url, "ui_url": url[: -len("/api")]}
        atomic_write_text(home / "server.json", json.dumps(info))
    try:
        with _exported(info["api_url"], home):
            yield info["api_url"]
    finally:
        me.unlink(missing_ok=True)
        if not keep and not _other_users(home):
            _flush_prefect()
            stop_server(info["pid"])
            (home / "server.json").unlink(missing_ok=True)


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


@contextlib.contextmanager
def _exported(api_url: str, home: Path) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("PREFECT_API_URL", "PREFECT_HOME")}
    os.environ["PREFECT_API_URL"] = api_url
    os.environ["PREFECT_HOME"] = str(home / "client_home")
    try:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
