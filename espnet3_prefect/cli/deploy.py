"""``deploy-local``: a local Prefect server, a process work pool, ``prefect deploy --all`` and a process
worker, in one step (127.0.0.1, or ``--host`` with basic auth and HTTPS); ``deploy-local --stop`` ends
them (and the worker's flow runs).

    espnet3-prefect deploy-local [--port 4200] [--host ADDRESS] [--postgres | --database URL] [--api-processes N]
    espnet3-prefect deploy-local --stop

The runs are kept in SQLite in the state dir by default (one person). ``--postgres`` keeps them in a
private PostgreSQL cluster started from the machine's binaries (``STATE_DIR/postgres``), ``--database
URL`` in a PostgreSQL the lab runs (:mod:`espnet3_prefect.server.postgres`): a lab's server. The choice
is remembered in the state dir (``database.json``), so a later ``deploy-local`` finds the same history.
``--api-processes N`` (N > 1, on PostgreSQL) runs N API processes apart from one process of background
services, with Redis messaging through a private ``redis-server`` (:mod:`espnet3_prefect.server.split`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from espnet3_prefect._internal.proc import pid_alive, stop_tree
from espnet3_prefect._internal.util import read_json
from espnet3_prefect.cli.common import SwitchCommand, add_auth_switch, add_server_options, add_tls_switch
from espnet3_prefect.errors import ConfigError, Espnet3PrefectError
from espnet3_prefect.execution.api_reach import PATIENT_RETRIES
from espnet3_prefect.server.postgres import STATE_SUBDIR

DEFAULT_POOL = "espnet3-local"
DEFAULT_UI_PORT = 4200
STATE_FILE = "deploy-local.json"
DATABASE_FILE = "database.json"  # the database deploy-local was last told to use: {"kind": ..., "url": ...}
POSTGRES_DIR = STATE_SUBDIR  # the private cluster's folder in the state dir
WORKER_START_TIMEOUT_S = 120
WORKER_QUERY_S = 2
CHECKPOINT_QUEUE = "checkpoints"  # evaluate/checkpoint's work queue in prefect.yaml: concurrency limit 1


def register(sub) -> None:
    deploy = sub.add_parser(
        "deploy-local",
        help="local Prefect server + process work pool + prefect deploy --all "
        "+ a process worker, in one step (127.0.0.1)",
    )
    deploy.add_argument(
        "--stop", action=SwitchCommand, handler=stop_local, help="stop the worker and server deploy-local started"
    )
    deploy.add_argument(
        "--port", type=int, default=None, help=f"server port (default {DEFAULT_UI_PORT} when free, else a free one)"
    )
    deploy.add_argument(
        "--host",
        default=None,
        metavar="ADDRESS",
        help="where the server listens: an address, interface or host name compute nodes reach "
        "(default 127.0.0.1); anything but loopback turns on basic auth and HTTPS "
        "(docs/security.md)",
    )
    add_auth_switch(deploy, "--auth")
    add_tls_switch(deploy, "--tls")
    where = deploy.add_mutually_exclusive_group()
    where.add_argument(
        "--postgres",
        action="store_true",
        help=f"keep the runs in a private PostgreSQL cluster started from this machine's binaries "
        f"(Debian's postgresql package; data in STATE_DIR/{POSTGRES_DIR}, 127.0.0.1, a generated password "
        "in a 0600 file): a lab's server. Remembered for later starts",
    )
    where.add_argument(
        "--database",
        default=None,
        metavar="URL",
        help="keep the runs in a PostgreSQL the lab runs: postgresql://USER@HOST[:PORT]/DB, its password "
        "in ~/.pgpass or the file PGPASSFILE names, never in the URL; 'sqlite': the default, SQLite in "
        "the state dir. Remembered for later starts",
    )
    deploy.add_argument(
        "--api-processes",
        type=int,
        default=1,
        metavar="N",
        help="N API processes on the one port, apart from one process of background services, with Redis "
        "messaging (a private redis-server in STATE_DIR/redis; pip install 'espnet3-prefect[lab]'); "
        "N > 1 needs --postgres or --database and serves HTTP (no --tls) (docs/lab-server.md)",
    )
    deploy.add_argument("--pool", default=DEFAULT_POOL, help="process work pool name (default %(default)s)")
    deploy.add_argument(
        "--project-dir",
        default=None,
        help="checkout holding prefect.yaml (default: this folder if it has one, else the "
        "checkout espnet3-prefect is installed from)",
    )
    add_server_options(
        deploy,
        keep=False,
        state_dir_help="server database, logs and pids (default $ESPNET3_PREFECT_HOME or ~/.espnet3-prefect)",
    )
    deploy.set_defaults(handler=deploy_local)


def _project(project_dir: str | None) -> Path:
    from espnet3_prefect.errors import ConfigError
    from espnet3_prefect.server.deploy_steps import project_root

    if project_dir is None and (Path.cwd() / "prefect.yaml").is_file():
        project_dir = os.getcwd()
    root = project_root(project_dir)
    if not (root / "prefect.yaml").is_file():
        raise ConfigError(f"--project-dir: {root} has no prefect.yaml")
    return root


def _client_env(creds, home: Path, project: Path) -> dict:
    """The environment of the prefect commands and the process worker (the credential in the
    environment, never on a command line)."""
    from espnet3_prefect._internal.util import CLIENT_FILE_VAR
    from espnet3_prefect.server.auth import exported_client_env

    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != CLIENT_FILE_VAR}
    env.update(
        exported_client_env(creds, home), ESPNET3_PREFECT_ROOT=str(project), PREFECT_SERVER_ANALYTICS_ENABLED="false"
    )
    return env


def _choose_port(port: int | None, host: str = "127.0.0.1") -> int:
    from espnet3_prefect.server.process import free_port

    if port:
        return port
    import socket

    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, DEFAULT_UI_PORT))
            return DEFAULT_UI_PORT
        except OSError:
            return free_port(host)


def _listens_to_sigint() -> None:
    """In the worker's child, before it runs: SIGINT back to its default. A command started in the
    background of a shell (``... &``, ``nohup``, a test suite run that way) has SIGINT ignored, every
    child inherits that, and Python keeps it ignored: the worker then never heard ``--stop``'s SIGINT
    and was killed after the 15-s wait (19-20 s per stop, the same 16 s here in a background run)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_worker(creds, pool: str, proc: subprocess.Popen, log: Path) -> float:
    started = time.monotonic()
    with creds.sync_client() as client:
        while time.monotonic() - started < WORKER_START_TIMEOUT_S:
            if proc.poll() is not None:
                tail = " ".join(log.read_text(errors="replace").split()[-80:])
                raise Espnet3PrefectError(f"the worker exited with code {proc.returncode}; log {log}: {tail}")
            if any(str(w.status).upper().endswith("ONLINE") for w in client.read_workers_for_work_pool(pool)):
                return time.monotonic() - started
            time.sleep(0.5)
    raise Espnet3PrefectError(
        f"the worker did not come online on pool {pool!r} in {WORKER_START_TIMEOUT_S} s; see {log}"
    )


def _database_choice(args: argparse.Namespace, home: Path) -> dict:
    """What the runs are kept in: ``{"kind": "sqlite" | "postgres" | "url", "url": ...}``, from the
    options, else what this state dir was last deployed with (:func:`_remember`)."""
    from espnet3_prefect.errors import ConfigError
    from espnet3_prefect.server.postgres import user_database

    if args.postgres:
        choice = {"kind": "postgres"}
    elif args.database is not None and args.database.strip().lower() == "sqlite":
        choice = {"kind": "sqlite"}
    elif args.database is not None:
        choice = {"kind": "url", "url": user_database(args.database).url}
    else:
        remembered = read_json(home / DATABASE_FILE)
        if remembered is None:
            return {"kind": "sqlite"}
        if not isinstance(remembered, dict) or remembered.get("kind") not in ("sqlite", "postgres", "url"):
            raise ConfigError(f"{home / DATABASE_FILE}: not a database choice deploy-local wrote; remove it")
        return remembered
    return choice


def _remember(home: Path, choice: dict) -> None:
    """Write ``choice`` down once a server runs on it (a refused or failed start changes nothing)."""
    from espnet3_prefect._internal.atomic import atomic_write_text

    if read_json(home / DATABASE_FILE) != choice:
        atomic_write_text(home / DATABASE_FILE, json.dumps(choice))


def _describe(choice: dict) -> str:
    return {"sqlite": "SQLite in the state dir", "postgres": "private PostgreSQL"}.get(
        choice["kind"], f"PostgreSQL {choice.get('url')}"
    )


def _open_database(choice: dict, home: Path):
    """The :class:`~espnet3_prefect.server.postgres.Database` of ``choice`` (the private cluster started
    unless it runs), None for SQLite."""
    from espnet3_prefect.server import postgres

    if choice["kind"] == "postgres":
        return postgres.start_postgres(home / POSTGRES_DIR)
    if choice["kind"] == "url":
        return postgres.user_database(choice["url"])
    return None


def deploy_local(args: argparse.Namespace) -> int:
    """Server (reused when running) + work pool + ``prefect deploy --all`` + a process worker."""
    from espnet3_prefect._internal.atomic import atomic_write_text
    from espnet3_prefect._internal.proc import run_command
    from espnet3_prefect.server.auth import server_client
    from espnet3_prefect.server.embedded import running_server, start_recorded
    from espnet3_prefect.server.host import auth_required, resolve_host, tls_required
    from espnet3_prefect.server.process import prefect_executable
    from espnet3_prefect.server.state_home import state_dir

    home = state_dir(args.state_dir)
    project = _project(args.project_dir)
    address = resolve_host(args.host) if args.host else "127.0.0.1"
    with_tls = tls_required(address, args.tls, args.auth)
    with_auth = auth_required(address, args.auth)
    wanted = {"wanted_host": address if args.host else None, "wanted_auth": with_auth, "wanted_tls": with_tls}
    choice = _database_choice(args, home)
    _check_api_processes(args.api_processes, choice, with_tls)
    current = read_json(home / STATE_FILE)
    if current and pid_alive(current.get("worker_pid", -1)) and running_server(home):
        _same_database(home, running_server(home), choice)
        _remember(home, choice)
        server_client(home, running_server(home), **wanted)
        _print_ready(current, "already running")
        return 0
    if os.environ.get("PREFECT_API_URL"):
        print("note: PREFECT_API_URL is set in this shell; deploy-local uses its own local server", file=sys.stderr)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    info = running_server(home)
    if info is not None and info.get("services", "all") not in ("all", "none"):
        raise Espnet3PrefectError(
            f"the Prefect server of {home} (pid {info['pid']}) was started by a run without "
            f"the deployment scheduler; deploy-local once that run has ended"
        )
    database, split = None, {}
    if info is not None:
        _same_database(home, info, choice)
    else:
        from espnet3_prefect.server.postgres import running_postgres, stop_postgres

        was_running = running_postgres(home / POSTGRES_DIR) if choice["kind"] == "postgres" else None
        database = _open_database(choice, home)
        redis = None
        try:
            server_kwargs = {}
            if args.api_processes > 1:
                from espnet3_prefect.server.split import prepare_split

                redis, env = prepare_split(home, args.api_processes, database)
                server_kwargs = {"services": "none", "extra_env": env, "api_processes": args.api_processes}
            info = start_recorded(
                home,
                ui=True,
                host=address,
                auth=with_auth,
                port=_choose_port(args.port, address),
                tls=with_tls,
                given_host=args.host,
                database=database,
                **server_kwargs,
            )
            if redis is not None:
                split = _start_split_services(home, info, redis, server_kwargs["extra_env"])
        except BaseException:
            if redis is not None:
                redis.stop()
            if database is not None and database.pid and was_running is None:
                stop_postgres(database.pid)  # started for this server only: nothing left behind
            raise
    if database is None and choice["kind"] == "postgres":
        from espnet3_prefect.server.postgres import running_postgres

        database = running_postgres(home / POSTGRES_DIR)
    _remember(home, choice)
    creds = server_client(home, info, **wanted)
    timings["server_s"] = time.monotonic() - t0
    # While deploy-local's server runs it counts as a user, so `espnet3-prefect infer` reuses it
    # and leaves it running.
    (home / "users").mkdir(exist_ok=True)
    (home / "users" / str(info["pid"])).touch()
    env = _client_env(creds, home, project)
    prefect = prefect_executable()
    t1 = time.monotonic()
    run_command([prefect, "work-pool", "create", args.pool, "--type", "process", "--overwrite"], env=env, timeout_s=120)
    run_command(
        [prefect, "--no-prompt", "deploy", "--all", "--pool", args.pool], env=env, timeout_s=600, cwd=str(project)
    )
    # evaluate/checkpoint's queue (made by the deploy): one run at a time, in the order the events made them
    run_command(
        [prefect, "work-queue", "set-concurrency-limit", CHECKPOINT_QUEUE, "1", "--pool", args.pool],
        env=env,
        timeout_s=120,
    )
    timings["deploy_s"] = time.monotonic() - t1
    log = home / "worker.log"
    with open(log, "ab") as handle:
        # the worker looks for runs every WORKER_QUERY_S (Prefect's default 10 s): a run a checkpoint
        # event created starts within that. Its API calls (and its flow runs') are retried as a run's
        # on a server not its own: with Prefect's 5 retries (~1 min a call) its poll loop gives up after
        # 12 failed polls (~13 min) and the worker exits, ending its flow runs, before a run would stop
        # waiting (parallel.api_outage_s, 15 min). A user's own settings win.
        mine = ("PREFECT_WORKER_QUERY_SECONDS", "PREFECT_CLIENT_MAX_RETRIES")
        worker_env = {
            "PREFECT_WORKER_QUERY_SECONDS": str(WORKER_QUERY_S),
            "PREFECT_CLIENT_MAX_RETRIES": str(PATIENT_RETRIES),
            **{k: v for k, v in os.environ.items() if k in mine},
            **env,
        }
        worker = subprocess.Popen(
            [prefect, "worker", "start", "--pool", args.pool, "--type", "process"],
            env=worker_env,
            cwd=str(project),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_listens_to_sigint,
        )
    state = {
        "server_pid": info["pid"],
        "worker_pid": worker.pid,
        "api_url": info["api_url"],
        "ui_url": info["ui_url"],
        "pool": args.pool,
        "project_dir": str(project),
        "state_dir": str(home),
        "worker_log": str(log),
        "client_file": creds.source,
        "ssl_cert_file": creds.ssl_cert_file,
        "auth": bool(creds.auth_string),
        "database": info.get("database"),  # a PostgreSQL URL (no password in it); None: SQLite
        "postgres_pid": database.pid if database is not None else None,  # the private cluster, stopped by --stop
        # a split server (--api-processes N): its services process and its Redis, stopped by --stop
        "api_processes": info.get("api_processes", 1),
        **split,
    }
    atomic_write_text(home / STATE_FILE, json.dumps(state, indent=2))
    try:
        timings["worker_s"] = _wait_for_worker(creds, args.pool, worker, log)
    except Espnet3PrefectError:
        from espnet3_prefect.server.registry import stop_worker

        stop_worker(worker.pid)
        raise
    state["timings"] = {k: round(v, 2) for k, v in timings.items()}
    atomic_write_text(home / STATE_FILE, json.dumps(state, indent=2))
    _print_ready(
        state,
        f"ready in {time.monotonic() - t0:.1f} s "
        f"(server {timings['server_s']:.1f} s, pool + deploy {timings['deploy_s']:.1f} s, "
        f"worker {timings['worker_s']:.1f} s)",
    )
    return 0


def _check_api_processes(n: int, choice: dict, with_tls: bool) -> None:
    """``--api-processes``: a positive count; more than one needs PostgreSQL, plain HTTP, prefect-redis."""
    if n < 1:
        raise ConfigError(f"--api-processes: {n} is not a positive number of API processes")
    if n == 1:
        return
    if choice["kind"] == "sqlite":
        raise ConfigError(f"--api-processes: {n} API processes need PostgreSQL; add --postgres or --database URL")
    if with_tls:
        raise ConfigError(
            f"--api-processes: {n} API processes serve HTTP only; drop --tls (and keep --host on loopback, "
            "where HTTPS is not required), or run one API process"
        )
    from espnet3_prefect.server.redis import check_prefect_redis, redis_executable

    check_prefect_redis()
    redis_executable()  # a missing redis-server is named here, before anything starts


def _start_split_services(home: Path, info: dict, redis, env: dict[str, str]) -> dict:
    """The background services of a split server (one process), beside its API; stops the API again
    if they fail to start. Returns what ``--stop`` needs: their pid and Redis's."""
    from espnet3_prefect.server.process import stop_server
    from espnet3_prefect.server.split import start_services

    try:
        services = start_services(home, env)
    except BaseException:
        stop_server(info["pid"])
        raise
    return {"services_pid": services.pid, "redis_pid": redis.pid}


def _same_database(home: Path, info: dict, choice: dict) -> None:
    """A server already running in ``home`` must keep its runs where ``choice`` says."""
    from espnet3_prefect.server.postgres import running_postgres

    running_on = info.get("database")
    wanted = {"sqlite": None, "url": choice.get("url")}.get(choice["kind"])
    if choice["kind"] == "postgres":
        cluster = running_postgres(home / POSTGRES_DIR)
        wanted = cluster.url if cluster is not None else "the private PostgreSQL"
    if running_on != wanted:
        raise Espnet3PrefectError(
            f"the Prefect server of {home} (pid {info['pid']}) keeps its runs in "
            f"{running_on or 'SQLite'}, not in {_describe(choice)}: "
            "deploy-local --stop first, or deploy-local with the same database"
        )


def _print_ready(state: dict, headline: str) -> None:
    from espnet3_prefect.server.state_home import state_dir

    print(f"espnet3-prefect local deployments {headline}")
    print(f"  UI:      {state['ui_url']}")
    print(f"  API:     export PREFECT_API_URL={state['api_url']}")
    if state.get("ssl_cert_file"):
        print(f"  https:   certificate of this server start in {state['ssl_cert_file']}; in a shell:")
        print(f"           export PREFECT_API_SSL_CERT_FILE={state['ssl_cert_file']}")
    if state.get("client_file") and state.get("auth", True):  # where the credential is, never the credential
        print(f"  auth:    basic auth; credential in {state['client_file']} (mode 0600); in a shell:")
        print(
            f"           export PREFECT_API_AUTH_STRING=\"$(python -c 'import json,sys; print(json.load("
            f'open(sys.argv[1]))["auth_string"])\' {state["client_file"]})"'
        )
    db, cluster = state.get("database"), state.get("postgres_pid")
    print(f"  runs in: {db or 'SQLite (state dir)'}" + (f" (private PostgreSQL, pid {cluster})" if cluster else ""))
    if state.get("api_processes", 1) > 1:
        print(
            f"  split:   {state['api_processes']} API processes (pid {state['server_pid']}), services pid "
            f"{state.get('services_pid')}, Redis pid {state.get('redis_pid')}"
        )
    print(f"  worker:  pid {state['worker_pid']} on process pool {state['pool']!r} (log {state['worker_log']})")
    print(f"  project: {state['project_dir']}")
    print("  try:     prefect deployment run infer/local --watch")
    print("           espnet3-prefect infer --detach --config recipes/dtmf/conf/inference.yaml")
    custom = Path(state["state_dir"]) != state_dir(None)
    print("  stop:    espnet3-prefect deploy-local --stop" + (f" --state-dir {state['state_dir']}" if custom else ""))


def stop_local(args: argparse.Namespace) -> int:
    """Stop the worker (and its flow runs), the server and the private PostgreSQL recorded by
    ``deploy-local``, in that order (the server writes what it holds before its database goes)."""
    from espnet3_prefect.server.embedded import forget_server, running_server
    from espnet3_prefect.server.postgres import running_postgres, stop_postgres
    from espnet3_prefect.server.process import STOP_TIMEOUT_S
    from espnet3_prefect.server.registry import stop_worker
    from espnet3_prefect.server.state_home import registry_dir, state_dir

    home = state_dir(args.state_dir)
    state = read_json(home / STATE_FILE)
    if state is None:
        cluster = running_postgres(home / POSTGRES_DIR)
        if cluster is not None and not running_server(home):  # left by a deploy-local that failed half-way
            stop_postgres(cluster.pid)
            print(f"stopped PostgreSQL pid {cluster.pid} (no server was using it)")
            return 0
        from espnet3_prefect.server.registry import format_servers, list_servers

        print(f"deploy-local started nothing in {home} (no {STATE_FILE}); the servers espnet3-prefect left running:")
        print(format_servers(list_servers()))
        return 0
    stopped = []
    if stop_worker(state["worker_pid"]):
        stopped.append(f"worker pid {state['worker_pid']}")
    if stop_tree(state["server_pid"], STOP_TIMEOUT_S):  # it drains its services' queues first
        stopped.append(f"server pid {state['server_pid']}")
    (home / "users" / str(state["server_pid"])).unlink(missing_ok=True)
    (registry_dir() / f"{state['server_pid']}.json").unlink(missing_ok=True)
    forget_server(home, state["server_pid"], state["api_url"])  # its record, credential and certificate
    stopped += _stop_split(home, state)
    cluster = running_postgres(home / POSTGRES_DIR)  # the recorded pid, if it still is that cluster's
    if state.get("postgres_pid") and cluster is not None and cluster.pid == state["postgres_pid"]:
        stop_postgres(cluster.pid)
        stopped.append(f"PostgreSQL pid {cluster.pid}")
    (home / STATE_FILE).unlink(missing_ok=True)
    print("stopped " + (", ".join(stopped) if stopped else "nothing (already gone)"))
    return 0


def _stop_split(home: Path, state: dict) -> list[str]:
    """A split server's services (SIGINT: the recorder writes what it holds), then its Redis, by the
    pids ``deploy-local`` recorded; after the API, so nothing new comes in."""
    from espnet3_prefect.server.redis import REDIS_DIR, stop_redis
    from espnet3_prefect.server.split import stop_services

    stopped = []
    if state.get("services_pid") and pid_alive(state["services_pid"]):
        stop_services(state["services_pid"])
        stopped.append(f"services pid {state['services_pid']}")
    if state.get("redis_pid") and pid_alive(state["redis_pid"]):
        stop_redis(state["redis_pid"], home / REDIS_DIR)
        stopped.append(f"Redis pid {state['redis_pid']}")
    return stopped
