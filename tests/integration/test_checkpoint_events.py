"""Every new checkpoint evaluated, for real: `espnet3-prefect deploy-local` (a real Prefect server with its
triggers, and a real process worker), `espnet3-prefect watch-checkpoints` as a real process, and three
real checkpoints of the demo model (torch state dicts whose filter banks miss two, one and no DTMF
tones, so they decode differently) written one after another into the experiment folder.

Asserted: three `evaluate/checkpoint` runs started by the checkpoint events alone (no `deployment run`),
a trend of three in checkpoint order with the best marked; a file written in slow chunks sends one
event, after its last byte; a copy of a scored checkpoint sends nothing; a watcher killed and started
again sends nothing twice; `checkpoint_saved()` of a scored checkpoint starts a run that decodes
nothing. The latency from a checkpoint's last byte to its `metrics.json` is printed.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from espnet3_prefect.cli.deploy import CHECKPOINT_QUEUE
from tests.helpers.api_reads import latest_artifact
from tests.helpers.postgres import DATABASES
from tests.helpers.procs import CLI, deploy_local, wait_for

pytestmark = pytest.mark.slow
SETTLE_S = 3.0


def demo_checkpoint(epoch: int, dead_tones: list[int], legacy: bool = False) -> bytes:
    """A Lightning-style checkpoint of the demo decoder whose filter bank lacks ``dead_tones``."""
    import torch

    from dtmf_demo.decoder import DTMFDecoder

    state = DTMFDecoder().state_dict()
    for tone in dead_tones:  # rows 0..6 cos, 7..13 sin of 697 ... 1477 Hz
        state["kernels"][tone] = 0
        state["kernels"][tone + 7] = 0
    buffer = io.BytesIO()
    torch.save(
        {"state_dict": state, "epoch": epoch, "global_step": 100 * epoch},
        buffer,
        _use_new_zipfile_serialization=not legacy,
    )
    return buffer.getvalue()


@pytest.fixture(scope="module", params=DATABASES)
def deployed(request, tmp_path_factory):
    """deploy-local on a copy of the project (demo data made up front); stopped after. On SQLite and
    on PostgreSQL (``--database``)."""

    def make_demo_data(project, env):
        subprocess.run(
            [*CLI[:1], "-m", "dtmf_demo.recipe", "--data-root", str(project / "exp/dtmf/data")],
            check=True,
            env=env,
            capture_output=True,
            timeout=300,
        )

    base = tmp_path_factory.mktemp("ckpt")
    with deploy_local(base, prepare=make_demo_data, database=request.param) as (proc, state, env):
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        env = {**env, "PREFECT_API_URL": state["api_url"], "PREFECT_HOME": str(base / "home/client_home")}
        yield {"project": base / "project", "env": env, "state": state, "base": base}


class WatcherProc:
    def __init__(self, d, exp_dir: Path, log: Path, *extra: str):
        self.log = log
        handle = open(log, "ab")
        self.proc = subprocess.Popen(
            [*CLI, "watch-checkpoints", str(exp_dir), "--settle-s", str(SETTLE_S), "--poll-s", "0.5", *extra],
            env=d["env"],
            cwd=d["project"],
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        handle.close()
        deadline = time.monotonic() + 60
        while "watching " not in log.read_text() and time.monotonic() < deadline:
            assert self.proc.poll() is None, log.read_text()
            time.sleep(0.2)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)


def checkpoint_events(d) -> list:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.events.filters import EventFilter, EventNameFilter

    with SyncPrefectClient(d["state"]["api_url"]) as client:
        page = client.read_events(EventFilter(event=EventNameFilter(name=["espnet3.checkpoint.saved"])), limit=50)
    return page.events


def checkpoint_runs(d) -> list:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with SyncPrefectClient(d["state"]["api_url"]) as client:
        deployment = client.read_deployment_by_name("evaluate/checkpoint")
        return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])))


def history(d) -> list[dict]:
    path = d["project"] / "exp/dtmf/inference/evaluate_history.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def write_slowly(path: Path, data: bytes, chunks: int, pause_s: float) -> float:
    """Write ``data`` in ``chunks`` pieces with pauses (a slow disk or a big model); returns the time of the
    last byte."""
    step = -(-len(data) // chunks)
    with open(path, "wb") as handle:
        for start in range(0, len(data), step):
            handle.write(data[start : start + step])
            handle.flush()
            os.fsync(handle.fileno())
            if start + step < len(data):
                time.sleep(pause_s)
        last = time.time()
    return last


@pytest.mark.postgres
def test_three_checkpoints_three_triggered_runs_and_a_trend(deployed):
    d = deployed
    exp = d["project"] / "exp/dtmf/checkpoints"
    exp.mkdir(parents=True)
    log = d["base"] / "watch.log"
    watcher = WatcherProc(d, exp, log)
    metrics = d["project"] / "exp/dtmf/inference/metrics.json"
    try:
        # 1: written at once; latency from its last byte to its metrics.json
        first = exp / "epoch=1-step=100.ckpt"
        first.write_bytes(demo_checkpoint(1, [0, 1]))
        last_byte = time.time()
        wait_for(lambda: len(history(d)) == 1, 300, "the first checkpoint's evaluation")
        latency_s = metrics.stat().st_mtime - last_byte
        [event] = checkpoint_events(d)
        [run] = checkpoint_runs(d)
        marks = {
            "event sent": event.occurred.timestamp(),
            "run created": run.created.timestamp(),
            "run started": run.start_time.timestamp(),
            "metrics.json": metrics.stat().st_mtime,
        }
        print(
            f"\nlatency, last byte of {first.name} -> its metrics.json: {latency_s:.1f} s ("
            + ", ".join(f"{k} +{v - last_byte:.1f} s" for k, v in marks.items())
            + ")"
        )
        assert history(d)[0]["checkpoint"]["epoch"] == 1

        # 2: zip written in slow chunks (pauses beyond a poll), 3: the old torch format (no zip end
        # record: complete only once its size settles), right behind it: they queue
        second = exp / "epoch=2-step=200.ckpt"
        events_before = len(checkpoint_events(d))
        second_done = write_slowly(second, demo_checkpoint(2, [0]), chunks=5, pause_s=1.0)
        assert len(checkpoint_events(d)) == events_before  # nothing for a half-written file
        third = exp / "epoch=3-step=300.ckpt"
        third_done = write_slowly(third, demo_checkpoint(3, [], legacy=True), chunks=3, pause_s=1.0)
        wait_for(lambda: len(history(d)) == 3, 400, "three evaluations")
        by_sha = {e.payload["sha256"]: e for e in checkpoint_events(d)}
        assert len(by_sha) == len(checkpoint_events(d)) == 3  # one event per checkpoint
        events = {e.payload["name"]: e for e in by_sha.values()}
        assert events[second.name].occurred.timestamp() >= second_done
        assert events[third.name].occurred.timestamp() >= third_done + SETTLE_S - 0.5
    finally:
        watcher.kill()

    records = history(d)  # scored in the order the checkpoints were saved (one queue, limit 1)
    assert [r["checkpoint"]["name"] for r in records] == [first.name, second.name, third.name]
    assert [r["checkpoint"]["step"] for r in records] == [100, 200, 300]
    wers = [r["headline"]["WER"]["test_clean"] for r in records]
    assert wers[0] > wers[1] > wers[2] == 0.0  # two tones missing, one, none
    assert records[2]["headline"]["WER"]["test_noisy"] == 4.0  # the demo's 8 designed errors
    assert all(r["shards_run"] > 0 for r in records)

    # a run appends its history line, then draws its charts and publishes its artifacts: let it end
    def ended():
        found = checkpoint_runs(d)
        return found if all(r.state.is_final() for r in found) else None

    runs = wait_for(ended, 120, "the three runs to end")
    assert len(runs) == 3 and all(r.state.is_completed() for r in runs)
    assert {r.work_queue_name for r in runs} == {CHECKPOINT_QUEUE}
    started = sorted(runs, key=lambda r: r.start_time)
    assert [r.parameters["checkpoint"].rsplit("/", 1)[-1] for r in started] == [first.name, second.name, third.name]
    assert all(a.end_time <= b.start_time for a, b in zip(started, started[1:]))  # one at a time
    names = sorted(r.name for r in runs)
    assert names == sorted(f"evaluate-{r['checkpoint']['name']}-{r['checkpoint']['sha256'][:8]}" for r in records)
    assert all("checkpoint" in r.tags and any(t.startswith("sha256:") for t in r.tags) for r in runs)
    png = d["project"] / "exp/dtmf/inference/evaluate_checkpoints.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from prefect.client.orchestration import SyncPrefectClient

    with SyncPrefectClient(d["state"]["api_url"]) as client:
        trend = latest_artifact(client, "evaluate-checkpoints")
    rows = [line for line in trend.data.splitlines() if line.startswith("| ") and "epoch=" in line]
    assert [row.split(" | ")[1].split("`")[1] for row in rows] == [first.name, second.name, third.name]
    assert "(best)" in rows[2] and "(best)" not in rows[0] and "data:image/png;base64," in trend.data

    # a copy of a scored checkpoint, and a watcher killed and started again: nothing new is sent
    (exp / "copy-of-first.ckpt").write_bytes(first.read_bytes())
    (exp / "last.ckpt").write_bytes(demo_checkpoint(2, [0]))  # the second saved again: the same bytes
    watcher = WatcherProc(d, exp, log)
    try:
        wait_for(lambda: log.read_text().count("same content as") >= 2, 120, "the watcher to look at the copies")
        time.sleep(SETTLE_S + 2)
    finally:
        watcher.kill()
    assert len(checkpoint_events(d)) == 3 and len(checkpoint_runs(d)) == 3 and len(history(d)) == 3

    # checkpoint_saved() from a training script, with its own state file: the event is sent, the run
    # it starts finds the content already scored and decodes nothing
    code = "import espnet3_prefect, sys; print(espnet3_prefect.checkpoint_saved(sys.argv[1], state_file=sys.argv[2]))"
    sent = subprocess.run(
        [*CLI[:1], "-c", code, str(first), str(d["base"] / "script-state.json")],
        env=d["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sent.returncode == 0 and len(sent.stdout.strip()) == 36, sent.stderr[-2000:]
    again = subprocess.run(
        [*CLI[:1], "-c", code, str(first), str(d["base"] / "script-state.json")],
        env=d["env"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0 and again.stdout.strip() == "None"  # same content: nothing sent
    first_three = {r.id for r in runs}
    [run] = wait_for(
        lambda: [r for r in checkpoint_runs(d) if r.id not in first_three and r.state.is_final()],
        300,
        "the run checkpoint_saved() started",
    )
    assert run.state.is_completed() and len(history(d)) == 3  # nothing decoded, nothing appended
    assert run.name == f"evaluate-{first.name}-{records[0]['checkpoint']['sha256'][:8]}"
    assert len(checkpoint_events(d)) == 4

    # --mode latest: epoch 5 and 6 arrive while epoch 4 is evaluated; 5 is passed over for 6
    watcher = WatcherProc(d, exp, log, "--mode", "latest")
    try:
        fourth = exp / "epoch=4-step=400.ckpt"
        fourth.write_bytes(demo_checkpoint(4, [2]))
        wait_for(
            lambda: [
                r for r in checkpoint_runs(d) if r.name.startswith(f"evaluate-{fourth.name}") and r.state.is_running()
            ],
            300,
            "the fourth checkpoint's run to start",
        )
        fifth, sixth = exp / "epoch=5-step=500.ckpt", exp / "epoch=6-step=600.ckpt"
        fifth.write_bytes(demo_checkpoint(5, [3]))
        wait_for(lambda: len(checkpoint_runs(d)) == 6, 120, "the fifth checkpoint's run to be queued")
        sixth.write_bytes(demo_checkpoint(6, [4]))
        wait_for(lambda: len([r for r in checkpoint_runs(d) if r.state.is_final()]) == 7, 400, "seven runs")
    finally:
        watcher.kill()
    assert all(r.state.is_completed() for r in checkpoint_runs(d))
    assert [r["checkpoint"]["name"] for r in history(d)[3:]] == [fourth.name, sixth.name]  # no fifth, in order
