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
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from espnet3_prefect._internal.atomic import atomic_write_text
from espnet3_prefect._internal.proc import pid_alive
from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.execution.api_reach import DEFAULT_API_OUTAGE_S, patient_client
from espnet3_prefect.server.guard import users_lock
from espnet3_prefect.server.port import project_port, remember_port
from espnet3_prefect.server.process import forget_server, running_server, start_server, stop_server
from espnet3_prefect.server.state_home import CLIENT_HOME_DIR, state_dir
from espnet3_prefect.server.watch import ServerWatch, watching

if TYPE_CHECKING:
    from espnet3_prefect.server.postgres import Database

log = logging.getLogger("espnet3_prefect")


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
    starting: Callable[[dict[str, str]], None] | None = None,
    watch: bool = False,
    rerun: str | None = None,
) -> Iterator[str]:
    """Yield a Prefect API URL: ``$PREFECT_API_URL``, else a running embedded server, else a new one.

    The URL is exported in ``os.environ`` (Dask workers and batch jobs inherit it) and set in
    Prefect's settings for this process. A server started here is stopped on exit unless
    ``keep`` is set or another run still uses it; one that is not kept runs only the services a run
    uses (``services="run"`` of :func:`start_server`). ``host`` (default ``$ESPNET3_PREFECT_SERVER_HOST``,
    else 127.0.0.1): where a new server listens; off loopback it asks for basic auth (``auth``: force
    it on loopback too; ``False`` off loopback is refused), see :mod:`espnet3_prefect.server.auth`, and
    serves HTTPS (``tls``: force it on loopback too, ``False``: plain HTTP), see :mod:`espnet3_prefect.server.https`.
    ``starting``, when given, is called once the API is chosen and before a new server is waited for,
    with the ``PREFECT_HOME`` this process will export (``{}`` for ``$PREFECT_API_URL``): work that
    needs no API yet (the fork server of the local workers) runs beside the server's start.
    ``watch``: while the block runs, the server is watched (:mod:`~espnet3_prefect.server.watch`): the
    run's own that stops mid-run ends the block within seconds as ``ServerGoneError``, whose line names
    the server and the command that finishes the run (``rerun``); ``$PREFECT_API_URL``'s is waited for,
    up to ``parallel.api_outage_s``, before it ends the block the same way.

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
        _beside_the_start(starting, {})
        with exported(external_client(lambda: state_dir(home))), patient_client():
            url, cafile = os.environ["PREFECT_API_URL"], os.environ.get("PREFECT_API_SSL_CERT_FILE")
            what = "the Prefect server of PREFECT_API_URL"
            with _watched(watch, url, what, rerun, cafile, outage_s=DEFAULT_API_OUTAGE_S):
                yield url
        return
    address = resolve_host(chosen_host) if chosen_host else "127.0.0.1"
    with_tls = tls_required(address, tls, auth)
    with_auth = auth_required(address, auth)
    home = state_dir(home)
    (home / "users").mkdir(exist_ok=True)
    me = home / "users" / str(os.getpid())
    watched: ServerWatch | None = None
    try:
        _beside_the_start(starting, {"PREFECT_HOME": str(home / CLIENT_HOME_DIR)})
        with users_lock(str(home)):  # registered, then found or started: none stops it in between
            me.touch()
            info = _found_or_started(home, ui, address, with_auth, with_tls, chosen_host, keep)
        creds = server_client(
            home, info, wanted_host=address if chosen_host else None, wanted_auth=with_auth, wanted_tls=with_tls
        )
    except BaseException:
        me.unlink(missing_ok=True)
        raise
    try:
        with exported(creds, home):
            what = f"the run's Prefect server (pid {info['pid']})"
            with _watched(watch, info["api_url"], what, rerun, info.get("ssl_cert_file")) as watched:
                yield info["api_url"]
    finally:
        with users_lock(str(home)):  # unregistered, checked, stopped: none takes it in between
            me.unlink(missing_ok=True)
            if not keep and not _other_users(home):
                if watched is None or watched.reason is None:  # nothing can be sent to a server that is gone
                    _flush_prefect()
                if _holds:
                    _left_running[home] = info
                else:
                    _stop(home, info)


def _found_or_started(
    home: Path, ui: bool, address: str, with_auth: bool, with_tls: bool, chosen_host: str | None, keep: bool
) -> dict:
    info = running_server(home)
    _report_left_over(home)
    if info is None:
        info = start_recorded(
            home,
            ui=ui,
            host=address,
            auth=with_auth,
            tls=with_tls,
            given_host=chosen_host,
            services="all" if keep else "run",
            guard_parent=None if keep else os.getpid(),
        )
    return info


@contextlib.contextmanager
def _watched(
    watch: bool, api_url: str, what: str, rerun: str | None, cafile: str | None, *, outage_s: float | None = 0.0
) -> Iterator[ServerWatch | None]:
    """The run's own server (``outage_s`` 0) ends the run once it stops answering; another is waited for."""
    if not watch:
        yield None
        return
    with watching(api_url, what=what, rerun=rerun, cafile=cafile, outage_s=outage_s) as watched:
        yield watched


def _report_left_over(home: Path) -> None:
    """Warn about the servers other runs left running and nothing uses (``espnet3-prefect servers``
    marks them too); one of ``home`` is reused by this run, and stopped at its end, so it goes unsaid."""
    from espnet3_prefect.server.registry import report_left_over

    try:
        report_left_over(skip_state_dir=home)
    except Exception as exc:  # noqa: BLE001 - a report only: the run goes on
        log.debug("could not look for servers left over: %s", exc)


def _beside_the_start(starting: Callable[[dict[str, str]], None] | None, environ: dict[str, str]) -> None:
    """``starting(environ)``, which only saves time: what fails there fails again, with its own
    message, where the run needs it (the flow opening its cluster)."""
    if starting is None:
        return
    try:
        starting(environ)
    except Exception as exc:  # noqa: BLE001
        log.debug("started nothing beside the server's start: %s", exc)


#: nesting depth of :func:`one_server` in this process, and the servers left running meanwhile
_holds: list[int] = []
_left_running: dict[Path, dict] = {}


@contextlib.contextmanager
def one_server() -> Iterator[None]:
    """While it lasts, a server :func:`prefect_api` would stop at its end stays up, and the next
    ``prefect_api`` of this process (same state folder) finds and uses it: the stages of one
    ``launch`` (``infer``, then ``measure``) share one server instead of starting one each (a start
    is seconds of CPU). It starts nothing itself (a run whose stages are all done starts no server),
    and at its end stops what was left running, unless another process uses it."""
    _holds.append(1)
    try:
        yield
    finally:
        _holds.pop()
        if not _holds:
            for home, info in list(_left_running.items()):
                del _left_running[home]
                with users_lock(str(home)):
                    if not _other_users(home):
                        _stop(home, info)


def _stop(home: Path, info: dict) -> None:
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
    guard_parent: int | None = None,
    database: Database | None = None,
    extra_env: dict[str, str] | None = None,
    api_processes: int = 1,
) -> dict:
    """Start a server for ``home`` (with a new credential when ``auth``, serving HTTPS with a new
    certificate naming ``host`` and ``given_host`` when ``tls``, running ``services``, under a guard
    that stops it once the process ``guard_parent`` has died, see :func:`start_server`), write its 0600
    client file (when ``auth`` or ``tls``) and record it in ``home/server.json``; return that record.
    ``database``: a PostgreSQL to keep the runs in (:mod:`~espnet3_prefect.server.postgres`), else SQLite.
    ``extra_env`` and ``api_processes``: a split server's API (:func:`~espnet3_prefect.server.split.prepare_split`),
    with ``services="none"``."""
    from espnet3_prefect.disk.client_file import ClientCredentials, client_file, write_client_file
    from espnet3_prefect.server.auth import new_auth_string
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
            guard_parent=guard_parent,
            database=database,
            extra_env=extra_env,
            api_processes=api_processes,
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
        "database": database.url if database is not None else None,
        "api_processes": api_processes,
    }
    if auth or tls:
        write_client_file(client_file(home), ClientCredentials(url, auth_string, ssl_cert_file=info["ssl_cert_file"]))
    atomic_write_text(home / "server.json", json.dumps(info))
    return info


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
