"""CLI commands beyond ``infer``: ``metrics``, ``evaluate``, ``deploy-local`` and ``infer --detach``.

    espnet3-prefect metrics  --config conf/metrics.yaml [key=value ...] [--inference-config conf/inference.yaml ...]
    espnet3-prefect evaluate --config conf/inference.yaml [parallel.yaml] --metrics-config conf/metrics.yaml
    espnet3-prefect deploy-local [--port 4200]     # server + process work pool + deploy --all + worker
    espnet3-prefect deploy-local --stop
    espnet3-prefect infer --detach --config conf/inference.yaml [--deployment infer/slurm]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .errors import Espnet3PrefectError

DEFAULT_POOL = "espnet3-local"
DEFAULT_UI_PORT = 4200
STATE_FILE = "deploy-local.json"
WORKER_START_TIMEOUT_S = 120


def register(sub: argparse._SubParsersAction, infer: argparse.ArgumentParser) -> None:
    """Add our subcommands to ``sub`` and ``--detach``/``--deployment`` to the ``infer`` parser."""
    infer.add_argument("--detach", action="store_true",
                       help="submit a run of a deployment (default infer/local) and return at once; "
                            "the run survives this shell (replaces ESPnet3's async_mode)")
    infer.add_argument("--deployment", default="infer/local",
                       help="with --detach: the deployment to run, e.g. infer/slurm (default %(default)s)")

    metrics = sub.add_parser("metrics", help="run the metrics stage (flow 'metrics')")
    metrics.add_argument("--config", nargs="+", required=True, metavar="FILE_OR_OVERRIDE",
                         help="metrics config files merged left to right, then key=value overrides")
    metrics.add_argument("extra", nargs="*", help="more config files or key=value overrides")
    metrics.add_argument("--inference-config", nargs="+", default=[], metavar="FILE_OR_OVERRIDE",
                         help="inference config files, then key=value overrides: the test sets dataset:<column> "
                              "inputs read (and inference_dir when the metrics config has none)")
    _server_options(metrics)

    evaluate = sub.add_parser("evaluate", help="infer then metrics, with a score history (flow 'evaluate')")
    evaluate.add_argument("--config", nargs="+", required=True, metavar="FILE_OR_OVERRIDE",
                          help="inference config files, then key=value overrides for infer")
    evaluate.add_argument("--metrics-config", nargs="+", required=True, metavar="FILE_OR_OVERRIDE",
                          help="metrics config files, then key=value overrides for metrics")
    _server_options(evaluate)

    deploy = sub.add_parser("deploy-local", help="local Prefect server + process work pool + prefect deploy --all "
                                                 "+ a process worker, in one step (127.0.0.1)")
    deploy.add_argument("--stop", action="store_true", help="stop the worker and server deploy-local started")
    deploy.add_argument("--port", type=int, default=None,
                        help=f"server port on 127.0.0.1 (default {DEFAULT_UI_PORT} when free, else a free one)")
    deploy.add_argument("--pool", default=DEFAULT_POOL, help="process work pool name (default %(default)s)")
    deploy.add_argument("--project-dir", default=None,
                        help="checkout holding prefect.yaml (default: this folder if it has one, else the "
                             "checkout espnet3-prefect is installed from)")
    deploy.add_argument("--state-dir", default=None,
                        help="server database, logs and pids (default $ESPNET3_PREFECT_HOME or ~/.espnet3-prefect)")


def _server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--state-dir", default=None,
                        help="embedded server state (default $ESPNET3_PREFECT_HOME or ~/.espnet3-prefect)")
    parser.add_argument("--keep-server", action="store_true", help="leave the embedded Prefect server running")


def dispatch(args: argparse.Namespace) -> int:
    if args.command == "infer":
        return run_detach(args)
    if args.command == "metrics":
        return run_metrics(args)
    if args.command == "evaluate":
        return run_evaluate(args)
    if args.command == "deploy-local":
        return stop_local(args) if args.stop else deploy_local(args)
    raise Espnet3PrefectError(f"unknown command {args.command!r}")


# -- metrics / evaluate in this process ------------------------------------------------------------

def run_metrics(args: argparse.Namespace) -> int:
    from .cli import split_args
    from .config import load_config
    from .metrics_stage import load_inference_config, prepare_metrics

    configs, overrides = split_args([*args.config, *args.extra])
    i_configs, i_overrides = split_args(args.inference_config)
    prepare_metrics(load_config(configs, overrides),  # config errors before any server starts
                    inference_config=load_inference_config(i_configs, i_overrides))
    from .server import prefect_api

    with prefect_api(args.state_dir, keep=args.keep_server) as api_url:
        from .flows.metrics import metrics

        print(f"Prefect API: {api_url}", file=sys.stderr)
        results = metrics(config=configs, overrides=overrides, inference_config=i_configs or None,
                          inference_overrides=i_overrides)
    for key, per_test in results.items():
        for test_set, result in per_test.items():
            print(f"{test_set}: {key}: {json.dumps(result)}")
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    from .cli import split_args
    from .flows.evaluate import plan_evaluation

    i_configs, i_overrides = split_args(args.config)
    m_configs, m_overrides = split_args(args.metrics_config)
    plan_evaluation(i_configs, m_configs, i_overrides, m_overrides)  # both configs, before any server
    from .server import prefect_api

    with prefect_api(args.state_dir, keep=args.keep_server) as api_url:
        from .flows.evaluate import evaluate

        print(f"Prefect API: {api_url}", file=sys.stderr)
        record = evaluate(infer_config=i_configs, metrics_config=m_configs, infer_overrides=i_overrides,
                          metrics_overrides=m_overrides)
    print(record["status"])
    for label, per_test in record["headline"].items():
        for test_set, value in per_test.items():
            print(f"{test_set}: {label} {value}")
    print(f"history: {Path(record['inference_dir']) / 'evaluate_history.jsonl'}")
    return 0


# -- infer --detach --------------------------------------------------------------------------------

def _deployment_name(name: str) -> str:
    return name if "/" in name else f"infer/{name}"


def find_api(state: str | None) -> str:
    """``$PREFECT_API_URL``, else the server ``deploy-local`` (or ``--keep-server``) left running."""
    from .server import _running, healthy, state_dir

    url = os.environ.get("PREFECT_API_URL")
    if url:
        if not healthy(url):
            raise Espnet3PrefectError(f"PREFECT_API_URL={url} does not answer")
        return url
    info = _running(state_dir(state))
    if info is None:
        raise Espnet3PrefectError("no Prefect server to submit to: run `espnet3-prefect deploy-local` "
                                  "(or set PREFECT_API_URL to a server with the deployments)")
    return info["api_url"]


def run_detach(args: argparse.Namespace) -> int:
    from .cli import split_args
    from .config import load_config
    from .stage import prepare_stages

    configs, overrides = split_args([*args.config, *args.extra])
    prepare_stages(load_config(configs, overrides))  # fail here, not in the worker
    api_url = find_api(args.state_dir)
    name = _deployment_name(args.deployment)
    parameters = {"config": [str(Path(c).resolve()) for c in configs], "overrides": overrides,
                  "workdir": os.getcwd()}
    flow_run, online = submit(api_url, name, parameters)
    ui = api_url[: -len("/api")] if api_url.endswith("/api") else api_url
    print(f"flow run id: {flow_run.id}")
    print(f"flow run:    {flow_run.name} of deployment {name}")
    print(f"UI:          {ui}/runs/flow-run/{flow_run.id}")
    print(f"watch:       PREFECT_API_URL={api_url} prefect flow-run logs {flow_run.id}")
    if not online:
        print(f"warning: no worker is online on the deployment's work pool; the run waits until one starts "
              f"(espnet3-prefect deploy-local starts one)", file=sys.stderr)
    return 0


def submit(api_url: str, name: str, parameters: dict):
    """Create a flow run of deployment ``name``; return it and whether its pool has a worker online."""
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.exceptions import ObjectNotFound

    with SyncPrefectClient(api_url) as client:
        try:
            deployment = client.read_deployment_by_name(name)
        except ObjectNotFound:
            raise Espnet3PrefectError(f"deployment {name!r} not found on {api_url}: run `espnet3-prefect deploy-local` "
                                      f"or `prefect deploy --all` from the project folder") from None
        flow_run = client.create_flow_run_from_deployment(deployment.id, parameters=parameters)
        online = False
        if deployment.work_pool_name:
            workers = client.read_workers_for_work_pool(deployment.work_pool_name)
            online = any(str(getattr(w, "status", "")).upper().endswith("ONLINE") for w in workers)
    return flow_run, online


# -- deploy-local ----------------------------------------------------------------------------------

def _alive(pid: int) -> bool:
    from .server import pid_alive

    return pid > 0 and pid_alive(pid)


def _project(project_dir: str | None) -> Path:
    from .deploy_steps import project_root
    from .errors import ConfigError

    if project_dir is None and (Path.cwd() / "prefect.yaml").is_file():
        project_dir = os.getcwd()
    root = project_root(project_dir)
    if not (root / "prefect.yaml").is_file():
        raise ConfigError(f"--project-dir: {root} has no prefect.yaml")
    return root


def _client_env(api_url: str, home: Path, project: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_API_URL=api_url, PREFECT_HOME=str(home / "client_home"), ESPNET3_PREFECT_ROOT=str(project),
               PREFECT_SERVER_ANALYTICS_ENABLED="false")
    return env


def _choose_port(port: int | None) -> int:
    from .server import free_port

    if port:
        return port
    import socket

    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", DEFAULT_UI_PORT))
            return DEFAULT_UI_PORT
        except OSError:
            return free_port()


def _wait_for_worker(api_url: str, pool: str, proc: subprocess.Popen, log: Path) -> float:
    from prefect.client.orchestration import SyncPrefectClient

    started = time.monotonic()
    with SyncPrefectClient(api_url) as client:
        while time.monotonic() - started < WORKER_START_TIMEOUT_S:
            if proc.poll() is not None:
                tail = " ".join(log.read_text(errors="replace").split()[-80:])
                raise Espnet3PrefectError(f"the worker exited with code {proc.returncode}; log {log}: {tail}")
            if any(str(w.status).upper().endswith("ONLINE") for w in client.read_workers_for_work_pool(pool)):
                return time.monotonic() - started
            time.sleep(0.5)
    raise Espnet3PrefectError(f"the worker did not come online on pool {pool!r} in {WORKER_START_TIMEOUT_S} s; see {log}")


def deploy_local(args: argparse.Namespace) -> int:
    """Server (reused when running) + work pool + ``prefect deploy --all`` + a process worker."""
    from ._proc import run_command
    from .atomic import atomic_write_text
    from .server import _prefect_executable, _running, start_server, state_dir

    home = state_dir(args.state_dir)
    project = _project(args.project_dir)
    current = _read_state(home)
    if current and _alive(current.get("worker_pid", -1)) and _running(home):
        _print_ready(current, "already running")
        return 0
    if os.environ.get("PREFECT_API_URL"):
        print("note: PREFECT_API_URL is set in this shell; deploy-local uses its own local server", file=sys.stderr)
    timings: dict[str, float] = {}
    t0 = time.monotonic()
    info = _running(home)
    if info is None:
        proc, api_url = start_server(home, port=_choose_port(args.port), ui=True)
        info = {"pid": proc.pid, "api_url": api_url, "ui_url": api_url[: -len("/api")]}
        atomic_write_text(home / "server.json", json.dumps(info))
    timings["server_s"] = time.monotonic() - t0
    # While deploy-local's server runs it counts as a user, so `espnet3-prefect infer` reuses it
    # and leaves it running.
    (home / "users").mkdir(exist_ok=True)
    (home / "users" / str(info["pid"])).touch()
    env = _client_env(info["api_url"], home, project)
    prefect = _prefect_executable()
    t1 = time.monotonic()
    run_command([prefect, "work-pool", "create", args.pool, "--type", "process", "--overwrite"], env=env,
                timeout_s=120)
    run_command([prefect, "--no-prompt", "deploy", "--all", "--pool", args.pool], env=env, timeout_s=600,
                cwd=str(project))
    timings["deploy_s"] = time.monotonic() - t1
    log = home / "worker.log"
    with open(log, "ab") as handle:
        worker = subprocess.Popen([prefect, "worker", "start", "--pool", args.pool, "--type", "process"],
                                  env=env, cwd=str(project), stdout=handle, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
    state = {"server_pid": info["pid"], "worker_pid": worker.pid, "api_url": info["api_url"], "ui_url": info["ui_url"],
             "pool": args.pool, "project_dir": str(project), "state_dir": str(home), "worker_log": str(log)}
    atomic_write_text(home / STATE_FILE, json.dumps(state, indent=2))
    try:
        timings["worker_s"] = _wait_for_worker(info["api_url"], args.pool, worker, log)
    except Espnet3PrefectError:
        _stop_pid(worker.pid)
        raise
    state["timings"] = {k: round(v, 2) for k, v in timings.items()}
    atomic_write_text(home / STATE_FILE, json.dumps(state, indent=2))
    _print_ready(state, f"ready in {time.monotonic() - t0:.1f} s "
                        f"(server {timings['server_s']:.1f} s, pool + deploy {timings['deploy_s']:.1f} s, "
                        f"worker {timings['worker_s']:.1f} s)")
    return 0


def _print_ready(state: dict, headline: str) -> None:
    print(f"espnet3-prefect local deployments {headline}")
    print(f"  UI:      {state['ui_url']}")
    print(f"  API:     export PREFECT_API_URL={state['api_url']}")
    print(f"  worker:  pid {state['worker_pid']} on process pool {state['pool']!r} (log {state['worker_log']})")
    print(f"  project: {state['project_dir']}")
    print("  try:     prefect deployment run infer/local --watch")
    print("           espnet3-prefect infer --detach --config recipes/dtmf/conf/inference.yaml")
    print("  stop:    espnet3-prefect deploy-local --stop" +
          (f" --state-dir {state['state_dir']}" if _custom_state_dir(state) else ""))


def _custom_state_dir(state: dict) -> bool:
    from .server import state_dir

    return Path(state["state_dir"]) != state_dir(None)


def _read_state(home: Path) -> dict | None:
    try:
        return json.loads((home / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None


def _descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux ``/proc``; empty elsewhere), parents first."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in parents.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def _stop_pid(pid: int, timeout_s: float = 15) -> bool:
    """Stop ``pid``, its process group and every process it started, also those in their own session
    (the worker starts each flow run as a child, which starts Dask workers): TERM, then KILL.
    True when something was running."""
    import signal

    from .server import stop_server

    if not _alive(pid):
        return False
    tree = _descendants(pid)
    stop_server(pid, timeout_s=timeout_s)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        left = [p for p in tree if _alive(p)]
        for child in left:
            try:
                os.kill(child, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + timeout_s
        while left and time.monotonic() < deadline:
            left = [p for p in left if _alive(p) and not _reap(p)]
            time.sleep(0.2)
    return True


def _reap(pid: int) -> bool:
    """True when ``pid`` is a zombie child of ours that is now reaped (or not our child)."""
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == pid
    except ChildProcessError:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
        except OSError:
            return True


def stop_local(args: argparse.Namespace) -> int:
    """Stop the worker (and its flow runs) and the server recorded by ``deploy-local``."""
    from .server import state_dir

    home = state_dir(args.state_dir)
    state = _read_state(home)
    if state is None:
        print(f"nothing to stop: no {home / STATE_FILE}")
        return 0
    stopped = []
    if _stop_pid(state["worker_pid"]):
        stopped.append(f"worker pid {state['worker_pid']}")
    if _stop_pid(state["server_pid"]):
        stopped.append(f"server pid {state['server_pid']}")
    (home / "users" / str(state["server_pid"])).unlink(missing_ok=True)
    try:
        server = json.loads((home / "server.json").read_text())
        if server.get("pid") == state["server_pid"]:
            (home / "server.json").unlink(missing_ok=True)
    except (OSError, ValueError):
        pass
    (home / STATE_FILE).unlink(missing_ok=True)
    print("stopped " + (", ".join(stopped) if stopped else "nothing (already gone)"))
    return 0
