"""A private ``redis-server`` for a Prefect server with more than one process (:mod:`.split`).

Prefect's messaging (the events every client sends, which the task-run recorder and the event
persister read), its messaging cache, causal ordering, concurrency leases and its background-task
queue (docket) live in one process's memory by default: fine for one ``prefect server start``, lost
when it stops. With more than one API process, or the API apart from the services, they must be
shared: ``prefect-redis`` puts them in Redis. This module starts the machine's ``redis-server`` for
that, privately: on 127.0.0.1 and a free port, a generated password (in the 0600 configuration file
and in the environment handed to Prefect, never on a command line), its data folder (append-only
file, so a stream not yet read survives a restart of Redis too) in the state dir, stopped by pid.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from espnet3_prefect._internal.atomic import atomic_write_text
from espnet3_prefect._internal.proc import pid_alive, stop_group
from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.server.process import free_port

REDIS_DIR = "redis"
"""The Redis folder inside a state dir: configuration, password, append-only file, log, pid."""
STARTUP_TIMEOUT_S = 30
#: the Redis database of Prefect's docket (background tasks); messaging uses database 0
DOCKET_DB = 1
#: the settings that move Prefect's messaging, cache, ordering and leases to Redis (prefect-redis)
PREFECT_REDIS_MODULES = {
    "PREFECT_MESSAGING_BROKER": "prefect_redis.messaging",
    "PREFECT_MESSAGING_CACHE": "prefect_redis.messaging",
    "PREFECT_SERVER_EVENTS_CAUSAL_ORDERING": "prefect_redis.ordering",
    "PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE": "prefect_redis.lease_storage",
}
#: How each publisher of prefect-redis hands messages to Redis: one at a time, by the coroutine that
#: got them, with no background flush. prefect-redis 0.3.0's publisher holds up to 5 messages and
#: flushes the rest every 10 s from a background task, so the last events of a client that stays
#: connected (a run's last shards, sent over its open websocket) wait in an API process for up to
#: 10 s, where the task-run recorder cannot read them: as long as the flow waits for its task runs
#: (``run_states.wait_until_recorded``, 10 s). Tested: 3 events are in the stream at once with these
#: settings, none until the client disconnects without them (``tests/integration/test_split_server.py``).
#: Besides, that flush takes its batch, awaits Redis (the duplicate check), then empties the batch, so
#: an event a connection hands over during that await is emptied with it and never published: tested
#: with the await held open (``test_each_event_reaches_the_redis_stream_when_it_is_sent_and_none_is_dropped``:
#: 1 of 2 land with the background flush, 2 of 2 with these settings). That is how one task run of
#: 2,008 went missing at full size before this setting (docs/benchmarks.md). With no background flush
#: every flush is awaited by the connection that sent the event, so none runs beside an append.
SAFE_PUBLISHER = {
    "PREFECT_REDIS_MESSAGING_PUBLISHER_BATCH_SIZE": "1",
    "PREFECT_REDIS_MESSAGING_PUBLISHER_PUBLISH_EVERY": str(365 * 24 * 3600),  # seconds: never, in practice
}


def redis_executable() -> str:
    """The machine's ``redis-server``, or a one-line error saying how to install it."""
    found = shutil.which("redis-server")
    if not found:
        raise Espnet3PrefectError(
            "redis-server is not installed (Debian/Ubuntu: apt-get install redis-server); "
            "it is needed for more than one API process"
        )
    return found


def check_prefect_redis() -> None:
    """A one-line error when ``prefect-redis`` is not importable (the ``lab`` extra)."""
    import importlib.util

    if importlib.util.find_spec("prefect_redis") is None:
        raise Espnet3PrefectError(
            "prefect-redis is not installed: pip install 'espnet3-prefect[lab]' (needed for Redis messaging)"
        )


@dataclass(frozen=True)
class RedisServer:
    """A running private ``redis-server``: its pid, port and password (read from its 0600 file)."""

    folder: Path
    pid: int
    port: int
    password: str
    host: str = "127.0.0.1"
    process: subprocess.Popen | None = field(default=None, compare=False, repr=False)

    def url(self, db: int = 0) -> str:
        """``redis://`` with the password: for environments only, never a command line or a log."""
        return f"redis://:{self.password}@{self.host}:{self.port}/{db}"

    def prefect_environ(self) -> dict[str, str]:
        """The variables that point a Prefect server process (API or services) at this Redis."""
        return {
            **PREFECT_REDIS_MODULES,
            **SAFE_PUBLISHER,
            "PREFECT_REDIS_MESSAGING_HOST": self.host,
            "PREFECT_REDIS_MESSAGING_PORT": str(self.port),
            "PREFECT_REDIS_MESSAGING_DB": "0",
            "PREFECT_REDIS_MESSAGING_PASSWORD": self.password,
            "PREFECT_SERVER_DOCKET_URL": self.url(DOCKET_DB),
        }

    def alive(self) -> bool:
        return pid_alive(self.pid) and ping(self.host, self.port, self.password)

    def stop(self, timeout_s: float = 20) -> None:
        """:func:`stop_redis`, then the process reaped when this process started it."""
        try:
            stop_redis(self.pid, self.folder, timeout_s)
        finally:
            if self.process is not None:
                self.process.wait(timeout=timeout_s)


def stop_redis(pid: int, folder: Path, timeout_s: float = 20) -> None:
    """Stop the private Redis ``pid`` whose folder is ``folder``: SIGTERM (Redis writes its append-only
    file and exits), SIGKILL after ``timeout_s``; its pid file goes. Also for a Redis another process
    started (``deploy-local --stop``)."""
    try:
        stop_group(pid, timeout_s)
    finally:
        (folder / "redis.pid").unlink(missing_ok=True)


def ping(host: str, port: int, password: str, timeout_s: float = 2.0) -> bool:
    """True when the Redis at ``host:port`` takes ``password`` and answers PING (redis-py, no retries)."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis(
        host=host,
        port=port,
        password=password,
        socket_timeout=timeout_s,
        socket_connect_timeout=timeout_s,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        return bool(client.ping())
    except (redis.RedisError, OSError):
        return False
    finally:
        client.close()


def start_redis(state: Path, host: str = "127.0.0.1") -> RedisServer:
    """Start a private ``redis-server`` for the state dir ``state`` and wait until it answers.

    Its folder ``state/redis`` keeps the configuration and the password (both 0600) and the data: a
    restart reuses the password and reads the append-only file back, so events not yet recorded
    are still there. Only 127.0.0.1 (or ``host``, an address) and a password; no command line holds it.
    """
    executable = redis_executable()
    folder = state / REDIS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    os.chmod(folder, 0o700)
    secret = folder / "password"
    if not secret.exists():
        with contextlib.suppress(FileExistsError):
            fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(secrets.token_urlsafe(32))
    password = secret.read_text().strip()
    port = free_port(host)
    conf = folder / "redis.conf"
    atomic_write_text(
        conf,
        "\n".join(
            [
                f"bind {host}",
                f"port {port}",
                "protected-mode yes",
                f'requirepass "{password}"',
                f'dir "{folder}"',
                "appendonly yes",
                "appendfsync everysec",
                'save ""',
                "daemonize no",
                f'pidfile "{folder / "redis.pid"}"',
                f'logfile "{folder / "redis.log"}"',
                "databases 4",
                "",
            ]
        ),
    )
    os.chmod(conf, 0o600)
    proc = subprocess.Popen(
        [executable, str(conf)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    server = RedisServer(folder=folder, pid=proc.pid, port=port, password=password, host=host, process=proc)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log = folder / "redis.log"
            tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
            raise Espnet3PrefectError(
                f"redis-server exited with code {proc.returncode}; log {log}: {' '.join(tail.split()[-40:])}"
            )
        if ping(host, port, password):
            return server
        time.sleep(0.1)
    server.stop()
    raise Espnet3PrefectError(f"redis-server did not answer in {STARTUP_TIMEOUT_S} s; see {folder / 'redis.log'}")
