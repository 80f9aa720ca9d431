"""A Prefect server split in processes: N API processes apart from one background-services process,
sharing a database and a private Redis (:mod:`.redis`) for messaging.

What one ``prefect server start`` keeps in its memory (the events clients send, read by the task-run
recorder and the event persister; the messaging cache, causal ordering, concurrency leases, the
background-task queue) goes to Redis here, so

- more than one API process can serve one port (``prefect server start --workers N --no-services``:
  Prefect allows it on PostgreSQL only);
- the services (``prefect server services start``) read the events from a Redis stream, and what they
  have not read yet survives a restart of the API and of the services (the stream lives in Redis,
  with an append-only file in the state dir): nothing a run sent is lost when the server restarts.

Every process is started with ``start_new_session`` and stopped by its pid: the API first (nothing
new comes in), then the services with SIGINT (Prefect's services stop on it and the task-run
recorder writes what it holds; SIGTERM would drop that), then Redis. The PID of each is in
``split.json`` in the state dir.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from espnet3_prefect._internal.atomic import atomic_write_text
from espnet3_prefect._internal.proc import pid_alive, run_command, stop_group
from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.server.postgres import Database
from espnet3_prefect.server.process import prefect_executable, start_server, stop_server
from espnet3_prefect.server.redis import SAFE_PUBLISHER, RedisServer, check_prefect_redis, start_redis
from espnet3_prefect.server.services import BATCHED
from espnet3_prefect.server.state_home import PREFECT_HOME_DIR

log = logging.getLogger("espnet3_prefect")
SPLIT_RECORD = "split.json"
SERVICES_LOG = "services.log"


def split_environ(home: Path, redis: RedisServer, database: Database | None) -> dict[str, str]:
    """The variables every process of the split server gets: Prefect's home in ``home``, Redis, the
    database (default: SQLite in Prefect's home), migrations done once before the start, the recorder
    and event persister batched (as a run's own server, :data:`.services.BATCHED`) unless the user's
    environment says otherwise."""
    env = {name: value for name, value in BATCHED.items() if name not in os.environ}
    env.update(redis.prefect_environ())
    for name in SAFE_PUBLISHER:  # a publisher that batches drops events (redis.SAFE_PUBLISHER): ours wins
        if os.environ.get(name, env[name]) != env[name]:
            log.warning("%s=%s is not used: the split server publishes one message at a time", name, os.environ[name])
    env["PREFECT_HOME"] = str(home / PREFECT_HOME_DIR)
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["PREFECT_API_DATABASE_MIGRATE_ON_START"] = "false"
    if database is not None:
        env.update(database.server_environ())  # its URL and password file, never the password
    return env


def migrate(env: dict[str, str], timeout_s: float = 300) -> None:
    """``prefect server database upgrade -y`` once, before any API process (N processes migrating at
    once would race)."""
    run_command(
        [prefect_executable(), "server", "database", "upgrade", "-y"], env={**os.environ, **env}, timeout_s=timeout_s
    )


def register_blocks_once(home: Path, env: dict[str, str]) -> None:
    """Prefect's block types written to the database by one API process, started and stopped again,
    before N of them start (seen here: two at once failed on ``uq_block_type__slug`` and the API
    exited as the first run began; a few seconds more at a lab server's start)."""
    proc, _ = start_server(home, None, False, services="none", extra_env=env, api_processes=1)
    stop_server(proc.pid)


def start_services(home: Path, env: dict[str, str]) -> subprocess.Popen:
    """``prefect server services start`` (foreground, its own session), logging to ``home/services.log``."""
    full = {**os.environ, **env}
    for inherited in ("PREFECT_API_URL", "PREFECT_UI_API_URL"):
        full.pop(inherited, None)
    with open(home / SERVICES_LOG, "ab") as logfile:
        proc = subprocess.Popen(
            [prefect_executable(), "server", "services", "start"],
            env=full,
            stdin=subprocess.DEVNULL,
            stdout=logfile,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    time.sleep(0.2)
    if proc.poll() is not None:
        raise Espnet3PrefectError(
            f"prefect server services exited with code {proc.returncode}; see {home / SERVICES_LOG}"
        )
    return proc


def stop_services(proc_or_pid: subprocess.Popen | int, timeout_s: float = 30) -> None:
    """SIGINT (the services stop, the recorder writes what it holds), SIGKILL after ``timeout_s``."""
    pid = proc_or_pid if isinstance(proc_or_pid, int) else proc_or_pid.pid
    stop_group(pid, timeout_s, first=signal.SIGINT)
    if not isinstance(proc_or_pid, int):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc_or_pid.wait(timeout=timeout_s)


@dataclass
class SplitServer:
    """A running split server: its API URL and the processes to stop (:meth:`stop`)."""

    home: Path
    api_url: str
    api: subprocess.Popen
    services: subprocess.Popen | None
    redis: RedisServer
    env: dict[str, str] = field(repr=False)

    def pids(self) -> dict[str, int]:
        out = {"api": self.api.pid, "redis": self.redis.pid}
        if self.services is not None:
            out["services"] = self.services.pid
        return out

    def stop_services(self) -> None:
        """Stop the background services only (the API keeps taking events; they wait in Redis)."""
        if self.services is not None:
            stop_services(self.services)
            self.services = None
            self._record()

    def start_services(self) -> None:
        if self.services is None:
            self.services = start_services(self.home, self.env)
            self._record()

    def stop(self) -> None:
        """API, then services (SIGINT), then Redis; each by pid; the record goes last."""
        try:
            stop_server(self.api.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.api.wait(timeout=5)
        finally:
            try:
                self.stop_services()
            finally:
                self.redis.stop()
                (self.home / SPLIT_RECORD).unlink(missing_ok=True)

    def _record(self) -> None:
        atomic_write_text(self.home / SPLIT_RECORD, json.dumps({"api_url": self.api_url, "pids": self.pids()}))


def prepare_split(home: Path, api_processes: int, database: Database | None) -> tuple[RedisServer, dict[str, str]]:
    """What comes before the API processes of a split server: Redis started, the database migrated
    once, Prefect's block types registered once (with more than one API process); returns Redis and
    the environment every process of the server gets. Redis is stopped again if a later step fails."""
    check_prefect_redis()
    if api_processes > 1 and database is None:
        raise Espnet3PrefectError(
            f"api_processes: {api_processes} API processes need PostgreSQL (a database); SQLite takes one"
        )
    home.mkdir(parents=True, exist_ok=True)
    redis = start_redis(home)
    try:
        env = split_environ(home, redis, database)
        migrate(env)
        if api_processes > 1:
            register_blocks_once(home, env)
            # each of N processes would register Prefect's block types at its start, all at once: the
            # second insert of a slug fails, that process's startup fails, and uvicorn stops them all
            env = {**env, "PREFECT_API_BLOCKS_REGISTER_ON_START": "false"}
    except BaseException:
        redis.stop()
        raise
    return redis, env


def start_split_server(
    home: Path,
    *,
    api_processes: int = 2,
    database: Database | None = None,
    port: int | None = None,
    ui: bool = False,
    services: bool = True,
) -> SplitServer:
    """Start Redis, migrate the database, start ``api_processes`` API processes on one port (127.0.0.1)
    and, with ``services``, the background services; return when the API is healthy.

    ``database``: a PostgreSQL (:mod:`.postgres`: a private cluster or a lab's own; needed for
    ``api_processes`` > 1); ``None``: SQLite in ``home``. Whatever fails to start is stopped again
    before the error is raised.
    """
    redis, env = prepare_split(home, api_processes, database)
    started: list = []
    try:
        api, api_url = start_server(home, port, ui, services="none", extra_env=env, api_processes=api_processes)
        started.append(api)
        server = SplitServer(home=home, api_url=api_url, api=api, services=None, redis=redis, env=env)
        if services:
            server.start_services()
        server._record()
        return server
    except BaseException:
        for proc in started:
            stop_server(proc.pid)
        redis.stop()
        raise


def leftover_pids(home: Path) -> list[int]:
    """The pids in ``home``'s split record that are still alive (none after :meth:`SplitServer.stop`)."""
    record = home / SPLIT_RECORD
    if not record.exists():
        return []
    pids = json.loads(record.read_text()).get("pids", {})
    return [pid for pid in pids.values() if pid_alive(pid)]
