"""A deployment's flow run outlives a restart of its Prefect server (docs/reliability.md row 24).

``deploy-local`` (SQLite) runs Prefect's process worker beside its server. A ``prefect deployment run``
of ``infer/local`` on a toy config that lasts ~15-20 s: once 4 of its 40 shards are done, the server
alone is SIGKILLed (its process group; the worker, in a session of its own, is left alone) and ~15 s
later started again on the same port with the same state folder, as ``deploy-local`` starts it
(``start_recorded``). The flow run opens its own server watch (``execution/server_watch.py``,
``deployment_watch``): it carries on through the outage and waits for the server. Asserted: the flow
run ends Completed with the output of an undisturbed run, the server holds its 40 shards Completed within
60 s of its end, and Prefect's worker is still running, polling the server again, and saw its flow-run
process exit cleanly (its log)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from espnet3_prefect._internal.proc import descendants
from tests.conftest import toy_config, write_yaml
from tests.helpers.procs import deploy_local, pid_alive, wait_for

pytestmark = pytest.mark.slow
PREFECT = str(Path(sys.executable).with_name("prefect"))
N_ITEMS, N_SHARDS, GAP_S = 160, 40, 15.0
EXPECTED = "".join(f"utt{i:05d} {3 * i * i}\n" for i in range(N_ITEMS))

# deploy-local's own start of its server (cli/deploy.py: start_recorded, SQLite, loopback, no auth),
# on the port it had; the dead server's records go, the new one counts as the deployment's user
RESTART = """
import json, sys
from pathlib import Path
from espnet3_prefect._internal.atomic import atomic_write_text
from espnet3_prefect.server.embedded import start_recorded
from espnet3_prefect.server.state_home import registry_dir
home, old, port = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
(registry_dir() / f"{old}.json").unlink(missing_ok=True)
(home / "users" / str(old)).unlink(missing_ok=True)
info = start_recorded(home, ui=True, host="127.0.0.1", auth=False, port=port, tls=False)
(home / "users" / str(info["pid"])).touch()
state = json.loads((home / "deploy-local.json").read_text())
state["server_pid"] = info["pid"]
atomic_write_text(home / "deploy-local.json", json.dumps(state, indent=2))
print(json.dumps(info))
"""


def _post(api_url: str, path: str, body: dict):
    request = urllib.request.Request(
        f"{api_url}/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.load(resp)


def _completed_shards(api_url: str, flow_run_id: str) -> int:
    runs = _post(api_url, "task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200})
    return sum(t["name"].startswith("run-shard-test_a-") and t["state_type"] == "COMPLETED" for t in runs)


def _flow_run(api_url: str, flow_run_id: str) -> dict:
    with urllib.request.urlopen(f"{api_url}/flow_runs/{flow_run_id}", timeout=30) as resp:
        return json.load(resp)


def test_a_deployment_run_outlives_a_restart_of_deploy_locals_server(tmp_path):
    cfg = toy_config(tmp_path / "toy", n=N_ITEMS, num_shards=N_SHARDS, n_workers=2)
    cfg["model"]["sleep_s"] = 0.15  # ~0.6 s a shard: ~15-20 s on 2 workers
    path = write_yaml(tmp_path / "toy" / "inference.yaml", cfg)
    out = Path(cfg["inference_dir"]) / "test_a"
    base = tmp_path / "deploy"
    base.mkdir()
    with deploy_local(base) as (proc, state, env):
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        api, home = state["api_url"], Path(state["state_dir"])
        port = int(api.rsplit(":", 1)[1].split("/")[0])
        worker_log = Path(state["worker_log"])
        client = {**env, "PREFECT_API_URL": api, "PREFECT_HOME": str(home / "client_home")}
        started = subprocess.run(
            [PREFECT, "deployment", "run", "infer/local", "--param", f"config={json.dumps([str(path)])}"],
            env=client,
            cwd=base,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert started.returncode == 0, started.stdout[-3000:] + started.stderr[-2000:]
        run_id = started.stdout.split("UUID:")[1].split()[0]

        deadline = time.monotonic() + 120
        while len(list(out.glob("split.*/done"))) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        t_four = time.monotonic()
        assert _flow_run(api, run_id)["state_type"] == "RUNNING"
        flow_procs = descendants(state["worker_pid"])
        assert flow_procs, "the worker's flow-run process"
        log_before = worker_log.stat().st_size
        old = state["server_pid"]
        os.killpg(old, signal.SIGKILL)  # the server only: the worker has a session of its own
        killed_at = time.monotonic()
        wait_for(lambda: not pid_alive(old), 30, "the server gone")
        gone_s = time.monotonic() - killed_at
        done_at_kill = len(list(out.glob("split.*/done")))
        time.sleep(GAP_S)
        done_in_gap = len(list(out.glob("split.*/done"))) - done_at_kill
        worker_alive_in_gap = pid_alive(state["worker_pid"])
        flow_alive_in_gap = pid_alive(flow_procs[0])

        restart = subprocess.run(
            [sys.executable, "-c", RESTART, str(home), str(old), str(port)],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert restart.returncode == 0, restart.stdout[-2000:] + restart.stderr[-3000:]
        info = json.loads(restart.stdout.strip().splitlines()[-1])
        state["server_pid"] = info["pid"]  # what the helper's exit checks is gone after deploy-local --stop
        assert info["api_url"] == api
        back_at, back_utc = time.monotonic(), datetime.now(UTC)

        run = wait_for(lambda: _ended(api, run_id), 240, "the flow run's end")
        ended_at = time.monotonic()
        assert run["state_type"] == "COMPLETED", (run["state"], worker_log.read_text(errors="replace")[-6000:])
        assert (out / "y.scp").read_text() == EXPECTED
        wait_for(lambda: _completed_shards(api, run_id) == N_SHARDS, 60, "40 shards recorded Completed")
        recorded_s = time.monotonic() - ended_at
        # Prefect's worker: alive, its flow-run process exited (status 0: it reports no crash), and its
        # polls reach the restarted server (the pool's queue polled since)
        wait_for(lambda: not pid_alive(flow_procs[0]), 30, "the flow-run process's exit")
        polled = wait_for(lambda: _polled_since(api, state["pool"], back_utc), 60, "the worker polling again")
        log = worker_log.read_bytes()[log_before:].decode(errors="replace")
        print(
            f"\nkilled {killed_at - t_four:.2f} s after 4 shards done, gone in {gone_s:.2f} s, then "
            f"{done_at_kill} shards done; {done_in_gap} more done in the {GAP_S:.0f}-s outage; "
            f"server back {back_at - killed_at:.1f} s after the kill; flow run Completed {ended_at - back_at:.1f} s "
            f"after, its 40 shards recorded {recorded_s:.1f} s after its end; worker alive in the gap "
            f"{worker_alive_in_gap}, flow-run process alive in the gap {flow_alive_in_gap}; the worker polled "
            f"the new server at {polled}\n--- the worker's own lines since the kill ---\n"
            + "\n".join(line for line in log.splitlines() if _the_workers(line))
        )
        assert done_in_gap > 0 and worker_alive_in_gap and flow_alive_in_gap  # the work went on meanwhile
        assert pid_alive(state["worker_pid"])
        assert "Process exited with status code" not in log and "Crashed" not in log, log[-6000:]


def _ended(api_url: str, flow_run_id: str) -> dict | None:
    run = _flow_run(api_url, flow_run_id)
    return run if run["state_type"] in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED") else None


def _polled_since(api_url: str, pool: str, since: datetime) -> str | None:
    for queue in _post(api_url, f"work_pools/{pool}/queues/filter", {}):
        if queue["last_polled"] and datetime.fromisoformat(queue["last_polled"]) > since:
            return queue["last_polled"]
    return None


def _the_workers(line: str) -> bool:
    """A line of Prefect's worker itself in its log (not one of the flow run's it passes through)."""
    return any(
        mark in line for mark in ("prefect.flow_runs.worker", "Observer", "Worker '", "Failed the last", "Backing off")
    )
