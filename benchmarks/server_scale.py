"""Server scale: one Prefect server taking a lab's load, side by side on SQLite, PostgreSQL, and
PostgreSQL + Redis with 2 API processes apart from the services (:mod:`espnet3_prefect.server.split`).

    .venv/bin/python -m benchmarks.server_scale [--quick] [--servers sqlite,postgresql,split2]

Everything on 127.0.0.1; each server started fresh, measured, stopped by pid. Per server:

(a) one ``espnet3-prefect infer`` run of 2,000 shards (1 item of 0.2 ms each) on 4 local workers, and
    one of 40: wall per extra shard, against ESPnet3's plain-Dask design on the same shards
    (:func:`benchmarks.baselines.plain_dask`, 4 workers, measured once: it uses no server); task runs
    recorded when the run ends, 10 s later, and once settled; server CPU and database bytes per task run.
(b) 4 ``infer`` runs at once, 500 shards each on 2 workers: errors (exit codes, "database is locked"),
    task runs recorded when the last one ends; then the server is restarted right away (a graceful stop)
    and the task runs recorded 10 s after it is back: what a restart loses.
(c) a synthetic recorder load: 4 client processes send task-run state changes (Pending, Running,
    Completed; the events a task run sends, :func:`prefect.utilities.engine.emit_task_run_state_change_event`,
    no task body) at a stepped rate of 10 s steps; a step is sustained when the server caught up: its
    last task run recorded within 1 s beyond the recorder's own cadence (it writes every
    ``FLUSH_S`` = 1 s, Prefect's shortest: it reads the setting as whole seconds), so within 2 s of
    the step's end. Reported: the highest sustained rate, against what a 64-worker run with
    10-second shards needs (6.4 task runs/s), and per step the rate the server recorded at.
    ``--load-only`` runs (c) alone.

Bounded: every wait has a limit, every load a count. ``--quick`` (400 shards, 4 x 100, load steps
10, 25, 100/s) took 8-13 min per server on a 2-core machine at load average 20-40; the default
size (2,000 shards, 4 x 500, steps to 800/s) has not been timed yet.
Wall and CPU on a shared 2-core machine are noisy: read the servers against each other, measured
in one run. ``python -m benchmarks.run --group server-scale`` runs the same and records its rows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import baselines, synthetic
from .orchestration import tree_cpu_s

ROOT = Path(__file__).resolve().parents[1]
COST_MS = 0.2
#: a 64-worker run with 10-second shards finishes 6.4 task runs a second; the goal is 10x that
NEEDED_RATE = 64 / 10.0
SERVERS = ("sqlite", "postgresql", "split2")
LABELS = {"sqlite": "SQLite", "postgresql": "PostgreSQL", "split2": "PostgreSQL + Redis, 2 API"}
LOCKED = "database is locked"
UNRECORDED = "task runs as finished"  # run_states.wait_until_recorded's warning


# ----------------------------------------------------------------------------- servers
@dataclass
class Server:
    """One server under test: started by :func:`start`, restarted by :meth:`restart`, stopped by pid."""

    kind: str
    work: Path
    api_url: str = ""
    handles: dict = field(default_factory=dict)
    database: object = None  # postgres.Database
    cluster: object = None  # postgres.Database of the private cluster (its pid)

    def start(self) -> None:
        from espnet3_prefect.server.process import start_server

        home = self.work / f"home_{self.kind}"
        home.mkdir(parents=True, exist_ok=True)
        if self.kind == "sqlite":
            proc, self.api_url = start_server(home, ui=False, services="all")
            self.handles = {"server": proc}
        elif self.kind == "postgresql":
            proc, self.api_url = start_server(home, ui=False, services="all", database=self.database)
            self.handles = {"server": proc}
        else:
            from espnet3_prefect.server.split import start_split_server

            split = start_split_server(home, api_processes=2, database=self.database)
            self.api_url, self.handles = split.api_url, {"split": split}

    def stop(self) -> None:
        from espnet3_prefect.server.process import stop_server

        if "split" in self.handles:
            self.handles.pop("split").stop()
        elif "server" in self.handles:
            stop_server(self.handles.pop("server").pid)

    def restart(self) -> None:
        self.stop()
        self.start()

    def pids(self) -> list[int]:
        """The processes whose CPU is the server's: API, services, Redis, PostgreSQL (each with children)."""
        if "split" in self.handles:
            out = list(self.handles["split"].pids().values())
        else:
            out = [self.handles["server"].pid]
        if self.cluster is not None:
            out.append(self.cluster.pid)
        return out

    def cpu_s(self) -> float:
        return sum(tree_cpu_s(pid) for pid in self.pids())

    def db_bytes(self) -> int:
        if self.database is None:
            folder = self.work / "home_sqlite/prefect_home"
            return sum(p.stat().st_size for p in folder.glob("prefect.db*"))
        return asyncio.run(_pg_size(self.database))


async def _pg_size(database) -> int:
    import urllib.parse

    import asyncpg

    url = urllib.parse.urlsplit(database.url)
    name = url.path.strip("/")
    conn = await asyncpg.connect(
        host=url.hostname, port=url.port, user=url.username, database=name, passfile=database.passfile
    )
    try:
        return int(await conn.fetchval("SELECT pg_database_size($1)", name))
    finally:
        await conn.close()


def count_task_runs(
    api_url: str, name_like: str | None = None, completed: bool = False, flow_name: str | None = None
) -> int:
    """``POST /task_runs/count``: all task runs, or those whose name holds ``name_like``, of the flow
    ``flow_name``, completed only."""
    body: dict = {"task_runs": {}}
    if name_like:
        body["task_runs"]["name"] = {"like_": name_like}
    if flow_name:
        body["flows"] = {"name": {"any_": [flow_name]}}
    if completed:
        body["task_runs"]["state"] = {"type": {"any_": ["COMPLETED"]}}
    request = urllib.request.Request(
        f"{api_url}/task_runs/count",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        return int(json.load(resp))


def settled(api_url: str, limit_s: float = 60, quiet_s: float = 3) -> int:
    """The task-run count once it has not changed for ``quiet_s`` (at most ``limit_s``)."""
    deadline, last, since = time.monotonic() + limit_s, -1, time.monotonic()
    while time.monotonic() < deadline:
        now = count_task_runs(api_url)
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        time.sleep(0.5)
    return last


# ----------------------------------------------------------------------------- runs
def _env(api_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env["PREFECT_API_URL"] = api_url
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def write_config(work: Path, name: str, shards: int, workers: int) -> Path:
    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(synthetic.config(str(work / name), shards, COST_MS, workers, shards)))
    return path


def infer_cmd(config: Path) -> list[str]:
    return [sys.executable, "-m", "espnet3_prefect.cli", "infer", "--config", str(config)]


def one_run(server: Server, name: str, shards: int, workers: int = 4) -> dict:
    """One CLI run: wall, exit code, lock errors, task runs recorded at its end (new ones)."""
    before = count_task_runs(server.api_url)
    started = time.perf_counter()
    with cli_runs([write_config(server.work, name, shards, workers)], server.api_url) as [proc]:
        out, err = proc.communicate(timeout=900)
    wall = time.perf_counter() - started
    return {
        "wall_s": wall,
        "rc": proc.returncode,
        "locked": (out + err).count(LOCKED),
        "at_end": count_task_runs(server.api_url) - before,
        "before": before,
        "tail": (err[-600:] if proc.returncode else ""),
    }


@contextlib.contextmanager
def cli_runs(configs: list[Path], api_url: str):
    """``espnet3-prefect infer`` on each config at once, each in a session of its own; whatever is
    still running when the block is left (an error, an interrupt) is stopped with its workers, by pid."""
    from espnet3_prefect._internal.proc import stop_group

    procs: list[subprocess.Popen] = []
    try:
        for config in configs:
            procs.append(
                subprocess.Popen(
                    infer_cmd(config),
                    env=_env(api_url),
                    cwd=ROOT,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            )
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                stop_group(proc.pid, 20, first=signal.SIGINT)
                proc.wait()


def plain_dask_walls(work: Path, sizes: tuple[int, ...], workers: int = 4) -> dict[int, float]:
    """ESPnet3's design on the same shards, each size in a fresh process (imports included, as the CLI)."""
    out = {}
    for shards in sizes:
        config = write_config(work, f"plain{shards}", shards, workers)
        cmd = [sys.executable, "-m", "benchmarks.server_scale", "plain", str(config), str(shards), str(workers)]
        started = time.perf_counter()
        subprocess.run([*cmd, str(work / f"plain{shards}_out")], cwd=ROOT, check=True, capture_output=True)
        out[shards] = time.perf_counter() - started
    return out


def _plain(config: str, shards: int, workers: int, out: str) -> None:
    from espnet3_prefect.config.load import load_config
    from espnet3_prefect.pipeline.stage import build_stages

    stage = build_stages(load_config([config]))[1][0]
    baselines.plain_dask(stage, shards, workers, shards, Path(out))


def concurrent_runs(server: Server, runs: int, shards: int) -> dict:
    """``runs`` CLI runs at once, 2 workers each; then a restart right at their end."""
    before = count_task_runs(server.api_url)
    started = time.perf_counter()
    configs = [write_config(server.work, f"{server.kind}_c{i}", shards, 2) for i in range(runs)]
    with cli_runs(configs, server.api_url) as procs:
        outs = [proc.communicate(timeout=900) for proc in procs]
    wall = time.perf_counter() - started
    at_end = count_task_runs(server.api_url) - before
    server.restart()
    time.sleep(10)
    after_restart = count_task_runs(server.api_url) - before
    return {
        "wall_s": wall,
        "failed": sum(proc.returncode != 0 for proc in procs),
        "locked": sum((o + e).count(LOCKED) for o, e in outs),
        # a run that ended before the server held all its task runs says so on one line (run_states)
        "unrecorded_at_end": [line for o, e in outs for line in (o + e).splitlines() if UNRECORDED in line],
        "at_end": at_end,
        "after_restart_10s": after_restart,
        "settled": settled(server.api_url) - before,
    }


# ----------------------------------------------------------------------------- synthetic load
def load_client(api_url: str) -> None:
    """A load client: imports Prefect, says ``ready``, then for each line ``PREFIX RATE SECONDS`` on
    stdin sends ``RATE`` task runs a second (3 state events each) for ``SECONDS``, waits until its
    events are sent, and prints how many task runs it sent."""
    os.environ["PREFECT_API_URL"] = api_url
    import uuid

    from prefect.client.schemas.objects import TaskRun
    from prefect.events.worker import EventsWorker
    from prefect.states import Completed, Pending, Running
    from prefect.utilities.engine import emit_task_run_state_change_event

    print("ready", flush=True)
    for line in sys.stdin:
        prefix, rate, seconds = line.split()
        rate, seconds = float(rate), float(seconds)
        sent, started = 0, time.perf_counter()
        while (now := time.perf_counter() - started) < seconds:
            due = int(now * rate) + 1
            while sent < due:
                run = TaskRun(id=uuid.uuid4(), name=f"{prefix}{sent}", task_key="synthetic", dynamic_key=str(sent))
                previous = None
                for state in (Pending(), Running(), Completed()):
                    emit_task_run_state_change_event(run, previous, state)
                    previous = state
                sent += 1
            time.sleep(0.002)
        EventsWorker.drain_all(timeout=60)
        print(sent, flush=True)


#: the recorder writes what it read every this many seconds (services.BATCHED's FLUSH_INTERVAL)
FLUSH_S = 1.0
#: a step is sustained when its last task run is recorded this long after the step's end at most
CAUGHT_UP_S = FLUSH_S + 1.0


def recorder_load(server: Server, rates: tuple[float, ...], step_s: float, clients: int = 4) -> list[dict]:
    """Steps of offered task runs/s from ``clients`` processes: per step, the rate they sent (their
    events all handed to the server), how long after that the step's last task run was recorded, and
    the rate it recorded at (the step's task runs over the step plus that lag). Stops after the
    first step the server did not catch up with (:data:`CAUGHT_UP_S`)."""
    cmd = [sys.executable, "-m", "benchmarks.server_scale", "load", server.api_url]
    procs = [
        subprocess.Popen(
            cmd,
            env=_env(server.api_url),
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        for _ in range(clients)
    ]
    steps = []
    try:
        for proc in procs:
            if proc.stdout.readline().strip() != "ready":
                raise RuntimeError("a load client did not start")
        for step, rate in enumerate(rates):
            prefix = f"{server.kind}-{os.getpid()}-{time.time_ns() % 10**9}-s{step}-"  # unique: counted by name
            started = time.perf_counter()
            for c, proc in enumerate(procs):
                proc.stdin.write(f"{prefix}c{c}- {rate / clients} {step_s}\n")
                proc.stdin.flush()
            sent = sum(int(proc.stdout.readline()) for proc in procs)
            ended = time.perf_counter()
            sent_rate = sent / (ended - started)
            deadline, recorded = ended + 20, 0
            while time.perf_counter() < deadline:
                recorded = count_task_runs(server.api_url, prefix, completed=True)
                if recorded >= sent:
                    break
                time.sleep(0.1)
            lag = time.perf_counter() - ended
            recorded_rate = recorded / (ended + lag - started)
            steps.append(
                {
                    "offered": rate,
                    "sent": sent,
                    "sent_rate": sent_rate,
                    "recorded": recorded,
                    "lag_s": lag,
                    "recorded_rate": recorded_rate,
                }
            )
            print(
                f"    {LABELS[server.kind]}: offered {rate:g}/s, sent {sent_rate:.1f}/s, "
                f"recorded {recorded_rate:.1f}/s, lag {lag:.2f} s",
                flush=True,
            )
            if lag > CAUGHT_UP_S:
                break
    finally:
        for proc in procs:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return steps


# ----------------------------------------------------------------------------- the group
@dataclass
class Sizes:
    big: int
    small: int
    concurrent: int
    rates: tuple[float, ...]
    step_s: float


def sizes(quick: bool) -> Sizes:
    if quick:
        return Sizes(big=400, small=40, concurrent=100, rates=(10, 25, 100), step_s=3)
    return Sizes(big=2000, small=40, concurrent=500, rates=(10, 25, 50, 100, 200, 400, 800), step_s=10)


def measure(server: Server, size: Sizes, plain: dict[int, float]) -> dict:
    small = one_run(server, f"{server.kind}_small", size.small)
    cpu0, bytes0, runs0 = server.cpu_s(), server.db_bytes(), count_task_runs(server.api_url)
    big = one_run(server, f"{server.kind}_big", size.big)
    time.sleep(10)
    big["plus_10s"] = count_task_runs(server.api_url) - big["before"]
    big["settled"] = settled(server.api_url) - big["before"]
    cpu = server.cpu_s() - cpu0
    task_runs = count_task_runs(server.api_url) - runs0
    db = server.db_bytes() - bytes0
    per_shard = (big["wall_s"] - small["wall_s"]) / (size.big - size.small)
    plain_per_shard = (plain[size.big] - plain[size.small]) / (size.big - size.small)
    conc = concurrent_runs(server, 4, size.concurrent)
    load = recorder_load(server, size.rates, size.step_s)
    return {
        "small": small,
        "big": big,
        "per_shard_ms": 1000 * per_shard,
        "plain_per_shard_ms": 1000 * plain_per_shard,
        "cpu_ms_per_task_run": 1000 * cpu / max(1, task_runs),
        "db_bytes_per_task_run": db / max(1, task_runs),
        "concurrent": conc,
        "load": load,
        "sustained": sustained(load),
    }


def sustained(load: list[dict]) -> float:
    """The highest rate sent in a step the server caught up with (:data:`CAUGHT_UP_S`)."""
    return max((s["sent_rate"] for s in load if s["lag_s"] <= CAUGHT_UP_S), default=0.0)


def load_rows(kind: str, load: list[dict]) -> list[tuple[str, float, str, str]]:
    """The sustained-rate row of one server's recorder load."""
    return [
        (
            f"{LABELS[kind]}: sustained task runs/s (last recorded within {CAUGHT_UP_S:g} s: the recorder's "
            f"{FLUSH_S:g}-s cadence + 1 s) / a 64-worker 10-s-shard run's need",
            sustained(load) / NEEDED_RATE,
            ">= 10" if kind != "sqlite" else "",
            f"{sustained(load):.0f} task runs/s; steps: "
            + ", ".join(
                f"{s['sent_rate']:.0f}/s recorded {s.get('recorded_rate', 0):.0f}/s lag {s['lag_s']:.1f} s"
                for s in load
            ),
        )
    ]


def rows(kind: str, size: Sizes, r: dict) -> list[tuple[str, float, str, str]]:
    """``(measure, value, goal, note)`` rows of one server's results."""
    label, big, conc = LABELS[kind], r["big"], r["concurrent"]
    # a run's task runs: its shards and the few around them (build-env, merge), as counted in (a)
    expected = 4 * (size.concurrent + big["settled"] - size.big)
    errors = big["rc"] != 0 or r["small"]["rc"] != 0
    return [
        (
            f"{label}: wall per extra shard, ours - plain Dask [ms]",
            r["per_shard_ms"] - r["plain_per_shard_ms"],
            "<= 5",
            f"ours {r['per_shard_ms']:.1f} ms, plain Dask {r['plain_per_shard_ms']:.1f} ms ({size.small} vs {size.big} "
            "shards, 4 workers)",
        ),
        (
            f"{label}: {size.big}-shard run, share of task runs recorded at its end",
            big["at_end"] / max(1, big["settled"]),
            "",
            f"{big['at_end']} at the end, {big['plus_10s']} at +10 s, {big['settled']} settled; wall "
            f"{big['wall_s']:.1f} s; exit {big['rc']}" + (f"; {errors=}" if errors else ""),
        ),
        (
            f"{label}: {size.big}-shard run, share recorded 10 s after its end",
            big["plus_10s"] / max(1, big["settled"]),
            "1.0",
            "",
        ),
        (f"{label}: server CPU per task run [ms]", r["cpu_ms_per_task_run"], "", "API, services, Redis, PostgreSQL"),
        (f"{label}: database bytes per task run", r["db_bytes_per_task_run"], "", "states, events, logs"),
        (
            f"{label}: 4 runs x {size.concurrent} shards at once, share recorded after a restart at their end (+10 s)",
            conc["after_restart_10s"] / expected,
            "1.0",
            f"{conc['at_end']} at the end, {conc['after_restart_10s']} after the restart, {conc['settled']} settled, "
            f"of {expected} sent; wall {conc['wall_s']:.1f} s; failed runs {conc['failed']}, "
            f"'{LOCKED}' {conc['locked']}; runs ending with task runs unrecorded "
            f"{len(conc.get('unrecorded_at_end', []))}",
        ),
        *load_rows(kind, r["load"]),
        (
            f"{label}: errors (failed runs, lock errors)",
            float(conc["failed"] + conc["locked"] + big["locked"] + int(errors)),
            "0",
            "",
        ),
    ]


def run_group(
    work: Path, quick: bool, servers: tuple[str, ...] = SERVERS, record=None, load_only: bool = False
) -> list[tuple]:
    """Run the group; ``record(group, name, value, goal, note)`` for each row (default: print).
    ``load_only``: only (c), the recorder load, on each server."""
    size = sizes(quick)
    record = record or (lambda g, n, v, goal="", note="": print(f"  {g:<12} {n:<90} {v:10.3f}  {goal:<6} {note}"))
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)  # PostgreSQL's user passes through to its cluster folder
    plain = None if load_only else plain_dask_walls(work, (size.small, size.big))
    cluster = None
    out = []
    try:
        if any(kind != "sqlite" for kind in servers):
            from espnet3_prefect.server import postgres

            reason = postgres.missing()
            if reason:
                print(f"  server-scale: PostgreSQL skipped ({reason})")
                servers = tuple(k for k in servers if k == "sqlite")
            else:
                cluster = postgres.start_postgres(work / "pg", durable=True)
        for kind in servers:
            server = Server(kind, work)
            if kind != "sqlite":
                from espnet3_prefect.server import postgres

                server.database = postgres.create_database(cluster, f"bench_{kind}")
                server.cluster = cluster
            print(f"  server-scale: {LABELS[kind]}", flush=True)
            server.start()
            try:
                if load_only:
                    result = {"load": recorder_load(server, size.rates, size.step_s)}
                else:
                    result = measure(server, size, plain)
            finally:
                server.stop()
            (work / f"{kind}.json").write_text(json.dumps(result, indent=1, default=str))
            made = load_rows(kind, result["load"]) if load_only else rows(kind, size, result)
            for name, value, goal, note in made:
                record("server-scale", name, value, goal, note)
                out.append((name, value, goal, note))
    finally:
        if cluster is not None:
            from espnet3_prefect.server import postgres

            postgres.stop_postgres(cluster.pid)
    return out


def rows_from(work: Path, quick: bool) -> None:
    """Print the rows again from the per-server JSON a ``--keep`` run left in ``work``."""
    for kind in SERVERS:
        path = work / f"{kind}.json"
        if path.exists():
            for name, value, goal, note in rows(kind, sizes(quick), json.loads(path.read_text())):
                print(f"| {name} | {value:.3f} | {goal} | {note} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="400 shards, 4 x 100, load steps 10, 25, 100/s")
    parser.add_argument("--servers", default=",".join(SERVERS), help=f"a comma list of {', '.join(SERVERS)}")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (its per-server JSON)")
    parser.add_argument("--load-only", action="store_true", help="only (c), the recorder load, on each server")
    args = parser.parse_args()
    servers = tuple(s for s in args.servers.split(",") if s)
    unknown = set(servers) - set(SERVERS)
    if unknown:
        raise SystemExit(f"--servers: {', '.join(sorted(unknown))} not one of {', '.join(SERVERS)}")
    work = Path(tempfile.mkdtemp(prefix="e3p-server-scale-"))
    started = time.perf_counter()

    def interrupted(signum, frame):  # a SIGTERM (timeout, kill) stops what we started, as Ctrl-C does
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        run_group(work, args.quick, servers, load_only=args.load_only)
    finally:
        print(f"  server-scale: {time.perf_counter() - started:.0f} s; work folder {work}", flush=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["plain"]:
        _plain(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    elif sys.argv[1:2] == ["rows"]:  # rows WORK [--quick]: the table of a --keep run, again
        rows_from(Path(sys.argv[2]), "--quick" in sys.argv)
    elif sys.argv[1:2] == ["load"]:
        load_client(sys.argv[2])
    else:
        with contextlib.suppress(KeyboardInterrupt):
            main()
