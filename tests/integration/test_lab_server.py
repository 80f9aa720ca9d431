"""A lab's server for real: ``deploy-local --postgres`` (a private PostgreSQL cluster from Debian's
binaries, a real Prefect server and process worker on 127.0.0.1), two ``infer`` runs from two folders
at once against it, ``--stop``, a plain ``deploy-local`` again (the database remembered), and
``--stop`` once more.

Asserted: each run completes in its own folder with every task run recorded within seconds of its
end (no other run's shards in its flow run); the history is whole after the restart; each stop
leaves no process (worker, server, PostgreSQL and its backends); the database password is in no
command line, environment, log or file of ours but its 0600 password file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import urllib.request
from pathlib import Path

import pytest

from espnet3_prefect._internal.proc import descendants, running
from espnet3_prefect.server.process import free_port
from espnet3_prefect.server.run_links import writer_runs
from tests.conftest import ROOT, toy_config, write_yaml
from tests.helpers import postgres as pg_helper
from tests.helpers.procs import CLI, copy_project, wait_for

pytestmark = pytest.mark.slow


class Sampler(threading.Thread):
    """Every process's command line and environment on this machine, sampled until stopped."""

    def __init__(self, every_s: float = 0.3):
        super().__init__(daemon=True)
        self.seen: set[bytes] = set()
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for entry in Path("/proc").glob("[0-9]*"):
                for part in ("cmdline", "environ"):
                    try:
                        self.seen.add((entry / part).read_bytes())
                    except OSError:
                        pass
            self._halt.wait(0.3)

    def stop(self) -> None:
        self._halt.set()
        self.join(30)


def _post(api_url: str, path: str, body: dict):
    request = urllib.request.Request(
        f"{api_url}/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.load(resp)


def _task_runs_of(api_url: str, flow_run_id: str) -> list[dict]:
    return _post(api_url, "task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200})


def _shards(api_url: str, flow_run_id: str) -> list[dict]:
    return [t for t in _task_runs_of(api_url, flow_run_id) if t["name"].startswith("run-shard-test_a-")]


def _completed_shards(api_url: str, flow_run_id: str) -> int:
    return sum(t["state_type"] == "COMPLETED" for t in _shards(api_url, flow_run_id))


def _deploy(env: dict, project: Path, *options: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*CLI, "deploy-local", "--port", str(free_port()), "--project-dir", str(project), *options],
        env=env,
        capture_output=True,
        text=True,
        timeout=500,
    )


def _family(state: dict) -> dict[int, str]:
    pids = [state["worker_pid"], state["server_pid"], state["postgres_pid"]]
    pids += [state[key] for key in ("services_pid", "redis_pid") if state.get(key)]  # a split server's
    found = {}
    for pid in pids:
        for member in (pid, *descendants(pid)):
            try:
                found[member] = Path(f"/proc/{member}/cmdline").read_bytes().decode(errors="replace")[:160]
            except OSError:
                pass
    return found


def _stop(env: dict, state: dict, data: Path) -> str:
    family = _family(state)
    assert any("postgres" in c for c in family.values()), family
    stop = subprocess.run([*CLI, "deploy-local", "--stop"], env=env, capture_output=True, text=True, timeout=120)
    assert stop.returncode == 0, stop.stderr
    assert f"PostgreSQL pid {state['postgres_pid']}" in stop.stdout, stop.stdout
    wait_for(lambda: not any(running(p) for p in family), 30, f"everything deploy-local started gone: {family}")
    leftovers = [
        e.name for e in Path("/proc").glob("[0-9]*") if str(data).encode() in _read(e / "cmdline")
    ]  # the postmaster names its data folder; its backends are its children (gone above)
    assert leftovers == []
    return stop.stdout


def _redis_available() -> bool:
    """redis-server and prefect-redis here (CI has both: E3P_REQUIRE_REDIS=1 fails without them)."""
    import importlib.util
    import os

    there = bool(shutil.which("redis-server")) and importlib.util.find_spec("prefect_redis") is not None
    if not there and os.environ.get("E3P_REQUIRE_REDIS") == "1":
        pytest.fail("redis-server or prefect-redis missing; E3P_REQUIRE_REDIS=1")
    return there


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_deploy_local_postgres_two_runs_at_once_history_kept_nothing_left():
    pg_helper.require()
    base = pg_helper.reachable_tmp()  # as root, the postgres user must pass through to the state dir
    project = copy_project(base)
    home = base / "home"
    env = pg_helper.client_env()
    env.update(ESPNET3_PREFECT_HOME=str(home), ESPNET3_PREFECT_REGISTRY=str(base / "registry"), PYTHONPATH=str(ROOT))
    sampler = Sampler()
    sampler.start()
    state = None
    outputs = []
    try:
        up = _deploy(env, project, "--postgres")
        assert up.returncode == 0, up.stdout[-2000:] + up.stderr[-3000:]
        state = json.loads((home / "deploy-local.json").read_text())
        assert state["database"].startswith("postgresql+asyncpg://prefect@127.0.0.1:") and state["postgres_pid"]
        assert f"runs in: {state['database']} (private PostgreSQL, pid {state['postgres_pid']})" in up.stdout
        api = state["api_url"]

        # two people's runs at once, each in its own folder, against the one server (the CLI finds it
        # through the state dir, as every run of the project does)
        runs = []
        for name in ("alice", "bob"):
            folder = base / name
            folder.mkdir()
            cfg = write_yaml(folder / "inference.yaml", toy_config(folder, n=12, num_shards=4))
            runs.append(
                (
                    folder,
                    subprocess.Popen(
                        [*CLI, "infer", "--config", str(cfg)],
                        env=env,
                        cwd=folder,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        text=True,
                    ),
                )
            )
        flow_runs = {}
        for folder, proc in runs:
            out, err = proc.communicate(timeout=400)
            assert proc.returncode == 0, out[-2000:] + err[-3000:]
            outputs.append(out + err)
            assert len(list((folder / "inference/test_a").glob("split.*/done"))) == 4, folder
            [run_id] = writer_runs([folder / "inference"])
            flow_runs[folder.name] = run_id
            # recorded within seconds of the run's end: its own 4 shards, none of the other run's
            wait_for(lambda run_id=run_id: _completed_shards(api, run_id) == 4, 10, f"{folder.name}'s shards recorded")
            assert len(_shards(api, run_id)) == 4
        assert flow_runs["alice"] != flow_runs["bob"]
        finished = {"flow_runs": {"state": {"type": {"any_": ["COMPLETED", "FAILED"]}}}}  # not the scheduled
        before = {r["id"] for r in _post(api, "flow_runs/filter", finished)}
        assert set(flow_runs.values()) <= before
        tasks_before = _post(api, "task_runs/count", {})

        data = home / "postgres" / "data"
        outputs.append(_stop(env, state, data))

        # no database option: the state dir remembers --postgres; this time 2 API processes apart
        # from the services, with Redis messaging (a lab that outgrew one API process)
        split = _redis_available()
        again = _deploy(env, project, *(("--api-processes", "2") if split else ()))
        assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
        outputs.append(again.stdout + again.stderr)
        state = json.loads((home / "deploy-local.json").read_text())
        assert "runs in: postgresql+asyncpg://" in again.stdout
        after = {r["id"] for r in _post(state["api_url"], "flow_runs/filter", finished)}
        assert before <= after  # every run's history kept
        assert _post(state["api_url"], "task_runs/count", {}) >= tasks_before
        if split:
            assert state["api_processes"] == 2 and state["services_pid"] and state["redis_pid"]
            assert f"split:   2 API processes (pid {state['server_pid']})" in again.stdout
            api_children = [
                c
                for c in _family({**state, "worker_pid": state["server_pid"]}).values()
                if "uvicorn" in c or "multiprocessing" in c
            ]
            assert len(api_children) >= 2, _family(state)  # the API processes, apart from the services
            folder = base / "carol"
            folder.mkdir()
            cfg = write_yaml(folder / "inference.yaml", toy_config(folder, n=12, num_shards=4))
            done = subprocess.run(
                [*CLI, "infer", "--config", str(cfg)], env=env, cwd=folder, capture_output=True, text=True, timeout=400
            )
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
            outputs.append(done.stdout + done.stderr)
            [run_id] = writer_runs([folder / "inference"])
            api = state["api_url"]
            wait_for(lambda: _completed_shards(api, run_id) == 4, 10, "the split server's run recorded")
        stopped = _stop(env, state, data)
        if split:
            assert f"services pid {state['services_pid']}" in stopped and f"Redis pid {state['redis_pid']}" in stopped
        outputs.append(stopped)
        state = None
    finally:
        sampler.stop()
        if state is not None:
            subprocess.run([*CLI, "deploy-local", "--stop"], env=env, capture_output=True, timeout=120)
    secret = (home / "postgres" / "pgpass").read_text().strip().rsplit(":", 1)[1]
    assert (home / "postgres" / "pgpass").stat().st_mode & 0o077 == 0
    assert not [s for s in sampler.seen if secret.encode() in s], "the password on a command line or in an environment"
    assert not [o for o in outputs if secret in o]
    ours = [p for p in home.rglob("*") if p.is_file() and "data" not in p.relative_to(home).parts[:2]]
    ours += [p for p in base.rglob("*") if p.is_file() and home not in p.parents and p.suffix in (".log", ".json")]
    holding = [str(p) for p in ours if p.name != "pgpass" and secret.encode() in _read(p)]
    assert holding == []
    shutil.rmtree(base, ignore_errors=True)
