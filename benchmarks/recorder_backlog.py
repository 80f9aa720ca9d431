"""Whether a long-running server (``deploy-local``'s, ``--keep-server``) keeps up with a run's task
runs: Prefect's default recorder settings, our batching (:data:`espnet3_prefect.server.services.BATCHED`)
and batching with a draining stop (:mod:`espnet3_prefect.server.serve`), side by side in one run, on
SQLite and on PostgreSQL, and the database bytes each task run costs.

    .venv/bin/python -m benchmarks.recorder_backlog [--task-runs 1000] [--databases sqlite,postgres]

For each database and each setting (:data:`SETTINGS`), a server (``services="all"``, as ``deploy-local`` starts it) on
a fresh database; a client process runs one flow of ``--task-runs`` tasks (8 threads, one log line
each: what a shard task sends). Printed per row:

- ``at end``: task runs recorded (Completed) when the flow returned; then the seconds until all were
  recorded (at most ``--wait-s``, else how many then);
- ``after stop``: a second flow of the same size, the server stopped gracefully (SIGTERM) the moment
  the flow returned, then started again on the same database: how many of that flow's task runs it has;
- ``bytes/1k``: database growth per 1,000 task runs over the first flow, once recorded, its events
  and logs included (SQLite: the file, its write-ahead log checkpointed into it; PostgreSQL:
  ``pg_database_size``).

Loopback only; every server and cluster it starts is stopped by pid before it returns.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: Prefect 3.9's own defaults for what :data:`BATCHED` sets (set explicitly for the ``prefect`` rows)
PREFECT_DEFAULTS = {
    f"PREFECT_SERVER_SERVICES_{service}_{key}": value
    for service, values in (
        ("TASK_RUN_RECORDER", (("READ_BATCH_SIZE", "1"), ("BATCH_SIZE", "1"), ("FLUSH_INTERVAL", "5"))),
        ("EVENT_PERSISTER", (("READ_BATCH_SIZE", "1"), ("BATCH_SIZE", "20"), ("FLUSH_INTERVAL", "5"))),
    )
    for key, value in values
}
NO_DRAIN = {"ESPNET3_PREFECT_DRAIN_TIMEOUT_S": "0"}
#: the rows: Prefect's defaults as a stock ``prefect server start`` runs them (what deploy-local and
#: --keep-server ran before); batching alone (what a CLI run's own server had); ours (batching, and
#: a stop that drains the services' queues)
SETTINGS = {"prefect": {**PREFECT_DEFAULTS, **NO_DRAIN}, "batched": NO_DRAIN, "ours": {}}

CLIENT = """
import sys
from prefect import flow, task, get_run_logger
from prefect.task_runners import ThreadPoolTaskRunner

@task
def shard(i):
    get_run_logger().info("shard %d done", i)
    return i

@flow(name=sys.argv[2], task_runner=ThreadPoolTaskRunner(max_workers=8))
def many(n):
    return len(shard.map(range(n)).result())

print(many(int(sys.argv[1])))
"""


def _count(api_url: str, flow_name: str) -> int:
    """The completed task runs of the flow ``flow_name``."""
    from benchmarks.server_scale import count_task_runs

    return count_task_runs(api_url, completed=True, flow_name=flow_name)


def _run_flow(api_url: str, n: int, name: str, work: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_API_URL=api_url, PREFECT_HOME=str(work / "client"), PREFECT_LOGGING_LEVEL="WARNING")
    done = subprocess.run(
        [sys.executable, "-c", CLIENT, str(n), name], env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0 or done.stdout.strip().splitlines()[-1:] != [str(n)]:
        raise RuntimeError(f"client flow failed: {done.stderr[-1500:]}")


def _db_bytes(home: Path, database) -> int:
    if database is None:  # the file once its write-ahead log is written into it
        import sqlite3

        path = home / "prefect_home" / "prefect.db"
        with contextlib.closing(sqlite3.connect(path, timeout=60)) as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return path.stat().st_size
    from urllib.parse import urlsplit

    import asyncpg

    url = urlsplit(database.url)

    async def size() -> int:
        conn = await asyncpg.connect(
            host=url.hostname, port=url.port, user=url.username, database=url.path[1:], passfile=database.passfile
        )
        try:
            return int(await conn.fetchval("SELECT pg_database_size(current_database())"))
        finally:
            await conn.close()

    return asyncio.run(size())


@contextlib.contextmanager
def _environ(values: dict[str, str]):
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def measure(setting: str, database, work: Path, n: int, wait_s: float) -> dict:
    from espnet3_prefect.server.embedded import start_recorded
    from espnet3_prefect.server.process import stop_server

    home = work / f"home-{setting}-{'pg' if database else 'sqlite'}"
    home.mkdir()
    row = {"setting": setting, "database": "postgresql" if database else "sqlite", "task_runs": n}
    with _environ(SETTINGS[setting]):
        info = start_recorded(home, ui=False, services="all", database=database)
        try:
            api = info["api_url"]
            before = _db_bytes(home, database)
            _run_flow(api, n, "first", work)
            row["at_end"] = _count(api, "first")
            started, recorded = time.monotonic(), row["at_end"]
            while recorded < n and time.monotonic() - started < wait_s:
                time.sleep(0.5)
                recorded = _count(api, "first")
            row["all_recorded_s"] = round(time.monotonic() - started, 1) if recorded == n else None
            row["recorded_after_wait"] = recorded
            row["bytes_per_1k"] = round((_db_bytes(home, database) - before) * 1000 / n)
            _run_flow(api, n, "second", work)
        finally:
            stop_server(info["pid"])
        info = start_recorded(home, ui=False, services="all", database=database)
        try:
            row["after_stop"] = _count(info["api_url"], "second")
        finally:
            stop_server(info["pid"])
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.recorder_backlog", description=__doc__)
    parser.add_argument("--task-runs", type=int, default=1000)
    parser.add_argument("--databases", default="sqlite,postgres")
    parser.add_argument("--wait-s", type=float, default=60)
    parser.add_argument("--json", default=None, help="also write the rows here")
    args = parser.parse_args(argv)
    from espnet3_prefect.server import postgres

    work = Path(tempfile.mkdtemp(prefix="e3p-recorder-"))
    work.chmod(0o755)  # as root, the postgres user passes through it
    cluster = None
    rows = []
    try:
        for kind in args.databases.split(","):
            for setting in SETTINGS:
                database = None
                if kind == "postgres":
                    if postgres.missing():
                        print(f"skipped postgres: {postgres.missing()}", flush=True)
                        break
                    cluster = cluster or postgres.start_postgres(work / "pg", durable=True)
                    database = postgres.create_database(cluster, f"bench_{setting}")
                rows.append(measure(setting, database, work, args.task_runs, args.wait_s))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        if cluster is not None:
            postgres.stop_postgres(cluster.pid)
        shutil.rmtree(work, ignore_errors=True)
    print(f"\n{'database':<11} {'setting':<8} {'at end':>9} {'all in (s)':>11} {'after stop':>11} {'bytes/1k':>10}")
    for r in rows:
        all_in = f"{r['all_recorded_s']}"
        if r["all_recorded_s"] is None:
            all_in = f">{args.wait_s:g} ({r['recorded_after_wait']})"
        print(
            f"{r['database']:<11} {r['setting']:<8} {r['at_end']:>5}/{r['task_runs']:<4} {all_in:>11} "
            f"{r['after_stop']:>6}/{r['task_runs']:<4} {r['bytes_per_1k']:>10}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
