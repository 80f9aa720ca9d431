"""A run outlives a Prefect server that is not its own (``PREFECT_API_URL``): the server is stopped
mid-run (SIGKILL on SQLite; a graceful stop on PostgreSQL; the split server's two API processes stopped
while its services and Redis stay up) and started again on the same port 15 s later (on SQLite also
2 minutes later). The work goes on meanwhile; the run ends exit 0 with the output of an undisturbed run, and the
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
from tests.helpers.procs import cli_env, start_infer

pytestmark = pytest.mark.slow
N_ITEMS, N_SHARDS, GAP_S = 160, 40, 15.0
LONG_GAP_S = 120.0  # a restart that takes minutes: an upgrade, a host reboot
EXPECTED = "".join(f"utt{i:05d} {3 * i * i}\n" for i in range(N_ITEMS))


@pytest.fixture
def lab(request, tmp_path):
    """The lab's server (:class:`tests.helpers.lab_server.LabServer`): SQLite, or the kind a test asks for
    (``indirect`` parameter: ``postgres``, ``split-api``)."""
    from tests.helpers.lab_server import LabServer

    server = LabServer(getattr(request, "param", "sqlite"), tmp_path)
    try:
        yield server
    finally:
        server.close()


def _post(url: str, path: str, body: dict):
    request = urllib.request.Request(
        f"{url}/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.load(resp)


def _start(tmp_path, url: str) -> subprocess.Popen:
    cfg = toy_config(tmp_path, n=N_ITEMS, num_shards=N_SHARDS)
    cfg["model"]["sleep_s"] = 0.15  # ~0.6 s a shard: ~12 s of work on 2 workers, outlasting the outage
    path = write_yaml(tmp_path / "inference.yaml", cfg)
    return start_infer(path, tmp_path, {**cli_env(tmp_path / "home"), "PREFECT_API_URL": url})


def _wait_for_done(out, n: int, proc, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and len(list(out.glob("split.*/done"))) < n and proc.poll() is None:
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the outage"


def _record(server, flow_run_id: str | None = None) -> tuple[dict, list[dict]]:
    runs = _post(server.url, "flow_runs/filter", {"limit": 10})
    run = next(r for r in runs if flow_run_id is None or r["id"] == flow_run_id)
    task_runs = _post(server.url, "task_runs/filter", {"flow_runs": {"id": {"any_": [run["id"]]}}, "limit": 200})
    return run, [t for t in task_runs if t["name"].startswith("run-shard-test_a-")]


@pytest.mark.parametrize(
    ("lab", "gap_s"),
    [
        ("sqlite", GAP_S),
        pytest.param("postgres", GAP_S, marks=pytest.mark.postgres),
        pytest.param("split-api", GAP_S, marks=pytest.mark.postgres, id="split-api"),
        pytest.param("sqlite", LONG_GAP_S, id="sqlite-2-min"),
    ],
    indirect=["lab"],
)
def test_a_lab_server_restarted_mid_run_costs_no_work_and_no_record(tmp_path, lab, gap_s):
    out = tmp_path / "inference/test_a"
    proc = _start(tmp_path, lab.url)
    _wait_for_done(out, 4, proc)
    lab.down()
    time.sleep(gap_s)
    assert proc.poll() is None, "the run ended during the outage"
    lab.up()
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
    keys = {a["key"] for a in _post(lab.url, "artifacts/filter", {"flow_runs": {"id": {"any_": [run["id"]]}}})}
    assert "infer-summary" in keys, keys


def test_a_driver_killed_during_an_outage_leaves_its_record_to_the_rerun(tmp_path, lab):
    out = tmp_path / "inference/test_a"
    proc = _start(tmp_path, lab.url)
    _wait_for_done(out, 4, proc)
    killed_run, _ = _record(lab)
    lab.down()
    _wait_for_done(out, 8, proc)  # shards finished while the server was gone
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its workers, as an OOM killer or a scancel would
    proc.communicate(timeout=60)
    done_by_killed = len(list(out.glob("split.*/done")))
    lab.up()
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
    rerun_run = next(r for r in _post(lab.url, "flow_runs/filter", {"limit": 10}) if r["id"] != killed_run["id"])
    _, rerun_shards = _record(lab, rerun_run["id"])
    assert len(rerun_shards) == N_SHARDS - done_by_killed
