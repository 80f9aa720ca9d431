"""The private PostgreSQL cluster of :mod:`espnet3_prefect.server.postgres`, real processes: it starts
from Debian's binaries on 127.0.0.1, keeps its password in a 0600 file and nowhere else (no command
line, environment or log), keeps its data across a stop and a start, and a stop leaves no process.
A Prefect server on it records a flow's task runs and keeps them across a restart of both."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import urllib.request
from pathlib import Path

import pytest

from espnet3_prefect.server import postgres
from tests.helpers import postgres as pg_helper

pytestmark = pytest.mark.slow


def _processes_of(data: Path) -> list[int]:
    """Every process whose command line names ``data`` (the postmaster and its backends name it via
    the postmaster's pid only, so also: children of that postmaster)."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if str(data).encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _secret_seen(secret: str) -> list[str]:
    """Where ``secret`` shows in any process's command line or environment."""
    seen = []
    for entry in Path("/proc").glob("[0-9]*"):
        for part in ("cmdline", "environ"):
            try:
                if secret.encode() in (entry / part).read_bytes():
                    seen.append(f"{entry}/{part}")
            except OSError:
                continue
    return seen


def _password(db: postgres.Database) -> str:
    return db.passfile.read_text().strip().rsplit(":", 1)[1]


async def _query(db: postgres.Database, sql: str):
    import asyncpg

    conn = await asyncpg.connect(db.url.replace("+asyncpg", ""), passfile=db.passfile)
    try:
        return await (conn.fetch(sql) if sql.lstrip().upper().startswith(("SELECT", "SHOW")) else conn.execute(sql))
    finally:
        await conn.close()


@pytest.fixture
def cluster_folder():
    pg_helper.require()
    base = pg_helper.reachable_tmp()
    started: list[int] = []
    yield base / "pg", started
    for pid in started:
        postgres.stop_postgres(pid)
    shutil.rmtree(base, ignore_errors=True)


def test_cluster_lifecycle_password_and_data(cluster_folder):
    folder, started = cluster_folder
    db = postgres.start_postgres(folder, durable=False)
    started.append(db.pid)
    assert (
        db.url.startswith("postgresql+asyncpg://prefect@127.0.0.1:") and ":" not in db.url.split("//")[1].split("@")[0]
    )
    assert stat.S_IMODE(db.passfile.stat().st_mode) == 0o600
    assert postgres.start_postgres(folder) == db  # running: the same cluster, not a second one

    asyncio.run(_query(db, "CREATE TABLE kept (x int); INSERT INTO kept VALUES (42)"))
    secret = _password(db)
    assert _secret_seen(secret) == []
    for log in ("postgres.log", "initdb.log"):
        assert secret not in (folder / log).read_text()

    # loopback only: nothing listens on another address, and no Unix socket exists
    listening = asyncio.run(_query(db, "SHOW listen_addresses"))[0][0]
    assert listening == "127.0.0.1"
    port = db.url.rsplit(":", 1)[1].split("/")[0]
    sockets = [Path(d) / f".s.PGSQL.{port}" for d in ("/tmp", "/var/run/postgresql", folder / "data")]
    assert [s for s in sockets if s.exists()] == []

    assert postgres.stop_postgres(db.pid) is True
    assert _processes_of(folder / "data") == []
    assert postgres.running_postgres(folder) is None
    assert postgres.stop_postgres(db.pid) is False  # gone: nothing to stop

    again = postgres.start_postgres(folder)
    started.append(again.pid)
    assert again.url == db.url  # the port of last time, free again
    assert asyncio.run(_query(again, "SELECT x FROM kept"))[0][0] == 42
    assert _password(again) == secret


def test_wrong_password_is_refused(cluster_folder):
    import asyncpg

    folder, started = cluster_folder
    db = postgres.start_postgres(folder, durable=False)
    started.append(db.pid)
    wrong = folder.parent / "wrong-pgpass"
    wrong.write_text(db.passfile.read_text().rsplit(":", 1)[0] + ":not-the-password\n")
    wrong.chmod(0o600)

    async def attempt():
        await asyncpg.connect(db.url.replace("+asyncpg", ""), passfile=wrong)

    with pytest.raises(asyncpg.InvalidPasswordError):
        asyncio.run(attempt())


def test_missing_binaries_name_the_package(tmp_path, monkeypatch):
    monkeypatch.setattr(postgres, "BIN_ROOT", tmp_path)
    with pytest.raises(postgres.PostgresError, match="install the Debian package 'postgresql'"):
        postgres.start_postgres(tmp_path / "pg")
    assert "\n" not in postgres.missing()
    assert not (tmp_path / "pg").exists()


def test_unreachable_folder_as_root_is_one_line():
    pg_helper.require()
    if os.geteuid() != 0:
        pytest.skip("only root runs PostgreSQL as another user")
    base = pg_helper.reachable_tmp()
    try:
        locked = base / "locked"
        locked.mkdir(mode=0o700)
        with pytest.raises(postgres.PostgresError, match=r"who cannot enter \S*/locked \(on the way to \S*/inner/pg\)"):
            postgres.start_postgres(locked / "inner" / "pg")
        assert not (locked / "inner" / "pg" / "data").exists()
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_prefect_server_stopped_at_once_keeps_every_task_run_across_a_restart(tmp_path):
    """A Prefect server on a fresh database of the shared cluster, stopped the moment a flow returns:
    its task runs are all in PostgreSQL, and a new server on the same database shows them."""
    from espnet3_prefect.server.embedded import start_recorded
    from espnet3_prefect.server.process import stop_server

    db = pg_helper.fresh_database()
    home = tmp_path / "home"
    home.mkdir()
    env = pg_helper.client_env()
    info = start_recorded(home, ui=False, database=db)
    try:
        import subprocess
        import sys

        code = (
            "from prefect import flow, task\n"
            "@task\ndef sq(x): return x * x\n"
            "@flow(name='pg-probe')\ndef f(): return sum(sq.map(range(12)).result())\n"
            "print(f())\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            env={**env, "PREFECT_API_URL": info["api_url"], "PREFECT_HOME": str(tmp_path / "client")},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout.strip().splitlines()[-1] == str(sum(x * x for x in range(12)))
    finally:
        stop_server(info["pid"])  # at once: a graceful stop writes what the server holds first
    count = "SELECT count(*) FROM task_run WHERE state_type = 'COMPLETED'"
    assert asyncio.run(_query(db, count))[0][0] == 12
    assert not (home / "prefect_home" / "prefect.db").exists()  # nothing went to SQLite

    info = start_recorded(home, ui=False, database=db)
    try:
        assert _api_count(info["api_url"], "flow_runs") == 1
        assert _api_count(info["api_url"], "task_runs") == 12
    finally:
        stop_server(info["pid"])


def _api_count(api_url: str, what: str) -> int:
    request = urllib.request.Request(
        f"{api_url}/{what}/count", data=b"{}", headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.loads(resp.read())
