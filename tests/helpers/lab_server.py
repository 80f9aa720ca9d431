"""A lab's Prefect server that a test or a benchmark takes down mid-run and starts again on the same
port: SQLite, PostgreSQL, or the split server (API processes apart from the services, Redis between),
all on 127.0.0.1 (tests/integration/test_server_outage.py, benchmarks/server_outage.py)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest


def require_redis() -> None:
    """Skip the calling test without redis-server or prefect-redis (the split server's parts); fail
    instead under ``E3P_REQUIRE_REDIS=1`` (CI)."""
    missing = [
        what
        for what, there in (
            ("redis-server (apt-get install redis-server)", shutil.which("redis-server")),
            ("prefect-redis (pip install 'espnet3-prefect[lab]')", importlib.util.find_spec("prefect_redis")),
        )
        if not there
    ]
    if missing:
        message = f"not installed: {', '.join(missing)}"
        if os.environ.get("E3P_REQUIRE_REDIS") == "1":
            pytest.fail(message + "; E3P_REQUIRE_REDIS=1")
        pytest.skip(message)


class LabServer:
    """A lab's Prefect server of ``kind``, started fresh in ``work``, taken down (:meth:`down`), started
    again on its port (:meth:`up`), stopped by pid (:meth:`close`). Kinds: ``sqlite`` (SIGKILLed),
    ``postgres`` (stopped gracefully), ``split-api`` (a split server's 2 API processes on PostgreSQL +
    Redis, stopped gracefully while its services and Redis stay up), ``split-all`` (the whole split
    server stopped and started again)."""

    def __init__(self, kind: str, work: Path):
        from espnet3_prefect.server.process import free_port

        self.kind, self.work, self.port = kind, work, free_port()
        self.database = None
        self.proc = None  # sqlite / postgres: the server; split-api: the API processes
        self.split = None  # split-all: the SplitServer
        self.redis = self.services = self.env = None  # split-api
        self.url = ""
        if kind.startswith("split"):
            require_redis()
        if kind == "sqlite":
            from tests.helpers.prefect_db import seed

            self.home = seed(work / "server")
        else:
            from tests.helpers import postgres

            self.database = postgres.fresh_database()
            self.home = postgres.reachable_tmp() if kind.startswith("split") else work / "server"
            self.home.mkdir(parents=True, exist_ok=True)
        if kind == "split-api":
            from espnet3_prefect.server.split import prepare_split, start_services

            self.redis, self.env = prepare_split(self.home, 2, self.database)
            self.up()
            self.services = start_services(self.home, self.env)
        else:
            self.up()

    def up(self) -> None:
        from espnet3_prefect.server.process import start_server

        if self.kind == "sqlite":
            self.proc, url = start_server(self.home, port=self.port, ui=False)
        elif self.kind == "postgres":
            self.proc, url = start_server(self.home, port=self.port, ui=False, database=self.database)
        elif self.kind == "split-api":
            self.proc, url = start_server(
                self.home, self.port, False, services="none", extra_env=self.env, api_processes=2
            )
        else:
            from espnet3_prefect.server.split import start_split_server

            self.split = start_split_server(self.home, api_processes=2, database=self.database, port=self.port)
            url = self.split.api_url
        assert not self.url or url == self.url, (url, self.url)
        self.url = url

    def down(self) -> None:
        from espnet3_prefect.server.process import stop_server

        if self.kind == "sqlite":
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            from espnet3_prefect.server.state_home import registry_dir

            (registry_dir() / f"{self.proc.pid}.json").unlink(missing_ok=True)
            self.proc = None
        elif self.kind in ("postgres", "split-api"):
            stop_server(self.proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(30)
            self.proc = None
        else:
            self.split.stop()
            self.split = None

    def close(self) -> None:
        from espnet3_prefect.server.process import stop_server
        from espnet3_prefect.server.split import stop_services

        try:
            if self.proc is not None:
                stop_server(self.proc.pid)
                self.proc = None
            if self.split is not None:
                self.split.stop()
                self.split = None
        finally:
            try:
                if self.services is not None:
                    stop_services(self.services)
                    self.services = None
            finally:
                if self.redis is not None:
                    self.redis.stop()
                    self.redis = None
                if self.kind.startswith("split"):
                    shutil.rmtree(self.home, ignore_errors=True)
