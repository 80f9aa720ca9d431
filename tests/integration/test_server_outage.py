"""A run outlives a Prefect server that is not its own (``PREFECT_API_URL``): the server is stopped
mid-run (SIGKILL on SQLite; a graceful stop on PostgreSQL) and started again on the same port ~15 s
later. The work goes on meanwhile; the run ends exit 0 with the output of an undisturbed run, and the
server holds every shard Completed, the flow run's state and its summary artifact within 60 s of the
run's end. A driver SIGKILLed during the outage leaves its finished shards to the re-run, which records
them in the killed flow run from their done markers (espnet3_prefect/execution/catch_up.py).
(The outage longer than ``parallel.api_outage_s``: tests/integration/test_server_faults.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request

import pytest

from tests.conftest import toy_config, write_yaml
from tests.helpers.procs import CLI, cli_env

pytestmark = pytest.mark.slow
N_ITEMS, N_SHARDS, GAP_S = 160, 40, 15.0
EXPECTED = "".join(f"utt{i:05d} {3 * i * i}\n" for i in range(N_ITEMS))


class Server:
    """A Prefect server of the test's own (the lab's), stopped and started again on one port."""

    def __init__(self, home, database):
        from espnet3_prefect.server.process import free_port

        self.home, self.database, self.port = home, database, free_port()
        self.pid = None
        self.start()

    def start(self) -> None:
        from espnet3_prefect.server.process import start_server

        self.proc, self.url = start_server(self.home, port=self.port, ui=False, database=self.database)
        self.pid = self.proc.pid

    def kill(self, graceful: bool) -> None:
        from espnet3_prefect.server.process import stop_server

        if graceful:
            stop_server(self.pid)
        else:
            os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait(30)

    def post(self, path: str, body: dict):
        request = urllib.request.Request(
            f"{self.url}/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as resp:
            return json.load(resp)

    def stop(self) -> None:
        from espnet3_prefect.server.process import stop_server

        stop_server(self.pid)


@pytest.fixture
def lab(request, tmp_path):
    """The lab's server: SQLite, or PostgreSQL where a test asks for it (``indirect`` parameter)."""
    from tests.helpers.prefect_db import seed

    database = None
    kind = getattr(request, "param", "sqlite")
    if kind == "postgres":
        from tests.helpers.postgres import fresh_database

        database = fresh_database()
    server = Server(seed(tmp_path / "lab"), database)
    server.graceful = kind == "postgres"
    try:
        yield server
    finally:
        server.stop()


def _start(tmp_path, url: str) -> subprocess.Popen:
    cfg = toy_config(tmp_path, n=N_ITEMS, num_shards=N_SHARDS)
    cfg["model"]["sleep_s"] = 0.15  # ~0.6 s a shard: ~12 s of work on 2 workers, outlasting the outage
    path = write_yaml(tmp_path / "inference.yaml", cfg)
    env = {**cli_env(tmp_path / "home"), "PREFECT_API_URL": url}
    return subprocess.Popen(
        [*CLI, "infer", "--config", str(path)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for_done(out, n: int, proc, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(list(out.glob("split.*/done"))) < n and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the outage"


def _record(server: Server, flow_run_id: str | None = None) -> tuple[dict, list[dict]]:
    runs = server.post("flow_runs/filter", {"limit": 10})
    run = next(r for r in runs if flow_run_id is None or r["id"] == flow_run_id)
    task_runs = server.post("task_runs/filter", {"flow_runs": {"id": {"any_": [run["id"]]}}, "limit": 200})
    return run, [t for t in task_runs if t["name"].startswith("run-shard-test_a-")]


@pytest.mark.parametrize("lab", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True)
def test_a_lab_server_restarted_mid_run_costs_no_work_and_no_record(tmp_path, lab):
    out = tmp_path / "inference/test_a"
    proc = _start(tmp_path, lab.url)
    _wait_for_done(out, 4, proc)
    lab.kill(graceful=lab.graceful)
    time.sleep(GAP_S)
    assert proc.poll() is None, "the run ended during the outage"
    lab.start()
    _, stderr = proc.communicate(timeout=600)
    ended = time.monotonic()
    assert proc.returncode == 0, stderr[-3000:]
    assert (out / "y.scp").read_text() == EXPECTED
    # one line when the server went, one when it came back; none of Prefect's per-event complaints
    assert stderr.count("is unreachable since") == 1, stderr[-3000:]
    assert stderr.count("answers again") == 1, stderr[-3000:]
    for noise in ("--- Error logging to API ---", "failed to process item", "Traceback"):
        assert noise not in stderr, stderr[-3000:]
    while True:  # the whole record, within 60 s of the run's end
        run, shards = _record(lab)
        completed = {t["name"] for t in shards if t["state_type"] == "COMPLETED"}
        if len(completed) == N_SHARDS or time.monotonic() - ended > 60:
            break
        time.sleep(1)
    assert run["state_type"] == "COMPLETED"
    assert len(completed) == N_SHARDS and len(shards) == N_SHARDS, sorted(completed)
    assert all(t["total_run_time"] > 0 for t in shards)
    keys = {a["key"] for a in lab.post("artifacts/filter", {"flow_runs": {"id": {"any_": [run["id"]]}}})}
    assert "infer-summary" in keys, keys


def test_a_driver_killed_during_an_outage_leaves_its_record_to_the_rerun(tmp_path, lab):
    out = tmp_path / "inference/test_a"
    proc = _start(tmp_path, lab.url)
    _wait_for_done(out, 4, proc)
    killed_run, _ = _record(lab)
    lab.kill(graceful=False)
    _wait_for_done(out, 8, proc)  # shards finished while the server was gone
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its workers, as an OOM killer or a scancel would
    proc.communicate(timeout=60)
    done_by_killed = len(list(out.glob("split.*/done")))
    lab.start()
    rerun = _start(tmp_path, lab.url)
    _, stderr = rerun.communicate(timeout=600)
    assert rerun.returncode == 0, stderr[-3000:]
    assert (out / "y.scp").read_text() == EXPECTED
    deadline = time.monotonic() + 30
    while True:  # sent by the re-run when it took over the killed run's lock; the recorder writes it soon after
        run, shards = _record(lab, killed_run["id"])
        completed = {t["name"] for t in shards if t["state_type"] == "COMPLETED"}
        if len(completed) >= done_by_killed or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert run["state_type"] == "CRASHED", run["state"]
    # every shard the killed run finished (by its done marker) is recorded as its own, once; the re-run
    # holds only the shards it ran
    assert len(completed) >= done_by_killed, (len(completed), done_by_killed)
    assert len({t["name"] for t in shards}) == len(shards)
    rerun_run = next(r for r in lab.post("flow_runs/filter", {"limit": 10}) if r["id"] != killed_run["id"])
    _, rerun_shards = _record(lab, rerun_run["id"])
    assert len(rerun_shards) == N_SHARDS - done_by_killed
