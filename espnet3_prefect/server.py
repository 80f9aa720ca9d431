"""The embedded default: one Prefect server on 127.0.0.1, shared by the flow and every Dask worker.

Without ``PREFECT_API_URL`` each process that runs a Prefect task would start its own temporary
server on one SQLite file (slow, "database is locked"). :func:`prefect_api` instead starts one
server (or reuses the one a concurrent run started), exports its URL so that Dask workers and
batch jobs inherit it, and stops it when the last user leaves.

State (database, logs, pids) lives in a per-project folder (:func:`state_dir`): the default is
``<project>/.e3p/prefect``, where ``<project>`` is the git checkout the command runs in (else the
current folder), so the UI of one project never shows another project's runs. Every server
started here is also recorded in a per-user registry (:func:`registry_dir`), so the servers left
running (``--keep-server``, ``deploy-local``) can be listed and stopped from anywhere
(:func:`list_servers`, :func:`stop_servers`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Iterator, NamedTuple

from ._proc import pid_alive, stop_group, stop_tree
from .atomic import atomic_write_text
from .errors import Espnet3PrefectError
from .util import read_json

log = logging.getLogger("espnet3_prefect")
DEFAULT_STATE_DIR = ".e3p/prefect"
"""The default state dir, relative to the project folder (:func:`project_folder`)."""
STATE_DIR_HELP = ("embedded server state (default $ESPNET3_PREFECT_HOME, else .e3p/prefect in the git "
                  "checkout of the current folder, else in the current folder)")
STARTUP_TIMEOUT_S = 180


def project_folder(start: str | Path | None = None) -> Path:
    """The git checkout holding ``start`` (default: the current folder), else ``start`` itself.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); (d / ".git").mkdir(); (d / "a/b").mkdir(parents=True)
    >>> project_folder(d / "a/b") == d.resolve()
    True
    """
    here = Path(start or os.getcwd()).expanduser().resolve()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():  # a folder, or a file in worktrees and submodules
            return folder
    return here


def default_state_dir(start: str | Path | None = None) -> Path:
    """``<project>/.e3p/prefect`` for the project of ``start`` (default: the current folder); not created."""
    return project_folder(start) / DEFAULT_STATE_DIR


def state_dir(path: str | Path | None = None) -> Path:
    """Where the embedded server keeps its database, logs and pid (created if missing).

    ``path``, else ``$ESPNET3_PREFECT_HOME``, else ``<project>/.e3p/prefect`` where ``<project>`` is
    the git checkout of the current folder (else the current folder): one Prefect server and UI per
    project, so the runs of unrelated projects never mix. ``.e3p/`` gets a ``.gitignore`` of ``*``,
    so it never shows as untracked in the user's repository.
    """
    chosen = path or os.environ.get("ESPNET3_PREFECT_HOME")
    if chosen:
        out = Path(chosen).expanduser().resolve()
    else:
        out = default_state_dir()
        _git_ignored(out.parent)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _git_ignored(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / ".gitignore"
    if not marker.exists():
        with contextlib.suppress(OSError):
            atomic_write_text(marker, "# espnet3-prefect's local state (Prefect server database, logs, pids)\n*\n")


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
    # The UI asks GET /ui-settings where its API is. Prefect answers PREFECT_UI_API_URL, whose default
    # is built from PREFECT_SERVER_API_PORT (4200), not from --port: without this the UI of a server on
    # any other port is blank, or shows the runs of whichever server holds 4200.
    env = {**os.environ, "PREFECT_HOME": str(home / "prefect_home"),
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "PREFECT_SERVER_UI_ENABLED": "true" if ui else "false",
           "PREFECT_SERVER_UI_API_URL": api_url}
    for inherited in ("PREFECT_API_URL", "PREFECT_UI_API_URL"):
        env.pop(inherited, None)
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
            _register(proc.pid, api_url, home, ui)
            return proc, api_url
        time.sleep(0.5)
    stop_server(proc.pid)
    raise Espnet3PrefectError(f"Prefect server did not become healthy in {STARTUP_TIMEOUT_S} s; see {home/'server.log'}")


def stop_server(pid: int, timeout_s: float = 20) -> None:
    """Stop the server process group started by :func:`start_server` (TERM, then KILL)."""
    try:
        stop_group(pid, timeout_s)
    finally:
        (registry_dir() / f"{pid}.json").unlink(missing_ok=True)


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


# -- the servers we started: records, listing, stopping ------------------------------------------

def registry_dir() -> Path:
    """Per-user records of the servers :func:`start_server` started, one ``<pid>.json`` each.

    ``$ESPNET3_PREFECT_REGISTRY``, else ``$XDG_STATE_HOME/espnet3-prefect/servers`` (default
    ``~/.local/state/espnet3-prefect/servers``). State dirs are per project; this folder is what
    finds a server left running from any folder.
    """
    chosen = os.environ.get("ESPNET3_PREFECT_REGISTRY")
    if not chosen:
        chosen = Path(os.environ.get("XDG_STATE_HOME") or "~/.local/state") / "espnet3-prefect" / "servers"
    return Path(chosen).expanduser()


@dataclass(frozen=True)
class ServerRecord:
    """A Prefect server started by espnet3-prefect that is still running."""

    pid: int
    api_url: str
    started: str  # ISO 8601 with the UTC offset, to the second
    state_dir: str
    ui: bool = True
    worker_pid: int | None = None  # deploy-local's process worker, when this is deploy-local's server

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

    def answers(self, timeout_s: float = 2.0) -> bool:
        return healthy(self.api_url, timeout_s)


def _register(pid: int, api_url: str, home: Path, ui: bool) -> None:
    record = {"pid": pid, "api_url": api_url, "started": datetime.now().astimezone().isoformat(timespec="seconds"),
              "state_dir": str(home), "ui": ui}
    try:
        registry_dir().mkdir(parents=True, exist_ok=True)
        atomic_write_text(registry_dir() / f"{pid}.json", json.dumps(record))
    except OSError as exc:  # a run does not fail for it; only `servers` will not list this one
        log.warning("could not record the Prefect server in %s: %s", registry_dir(), exc)


def _is_prefect_server(pid: int) -> bool:
    """Alive, and (where /proc tells) still a ``prefect`` process, not a recycled pid."""
    if not isinstance(pid, int) or pid <= 0 or not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True
    return b"prefect" in cmdline


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
            fields = {"pid": pid, "api_url": str(data["api_url"]), "started": str(data.get("started", "")),
                      "state_dir": str(data.get("state_dir", "")), "ui": bool(data.get("ui", True))}
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours to judge; never deleted
        if not _is_prefect_server(pid):
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


def stop_servers(target: str, *, force: bool = False, timeout_s: float = 20) -> StopOutcome:
    """Stop the servers :func:`find_servers` finds for ``target``, with deploy-local's worker (and the
    flow runs it started) when it is deploy-local's server. A server another espnet3-prefect process
    is using is left running unless ``force``."""
    stopped, busy = [], []
    for server in find_servers(target):
        if server.users() and not force:
            busy.append(server)
            continue
        if server.worker_pid:
            stop_tree(server.worker_pid, timeout_s)
        stop_server(server.pid, timeout_s)
        _forget(server)
        stopped.append(server)
    return StopOutcome(stopped, busy)


def _forget(server: ServerRecord) -> None:
    """Remove what the state dir says about a server that is gone."""
    home = Path(server.state_dir)
    (home / "users" / str(server.pid)).unlink(missing_ok=True)
    for name, key in (("server.json", "pid"), ("deploy-local.json", "server_pid")):
        with contextlib.suppress(OSError, ValueError):
            if json.loads((home / name).read_text()).get(key) == server.pid:
                (home / name).unlink(missing_ok=True)


def kept_server_message(server: ServerRecord) -> str:
    """What the CLI prints when it leaves a server running (``--keep-server``)."""
    return (f"Prefect server left running (pid {server.pid}, state {server.state_dir}):\n"
            f"  UI:   {server.ui_url}\n"
            f"  stop: {server.stop_command}")


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
        rows.append((str(s.pid), s.ui_url, s.started.replace("T", " ")[:19], s.state_dir, note))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + (f"  ({r[4]})" if r[4] else "") for r in rows]
    lines[0] = lines[0].rstrip()
    return "\n".join(lines) + "\nstop one: espnet3-prefect servers --stop <UI URL or pid>; all: --stop all"
