"""Faults on real LocalClusters: merged output is complete and identical to a clean run, or absent
with a clear reason. (docs/reliability.md states the guarantees these tests hold us to.)"""

from __future__ import annotations

import collections
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dask
import pytest

from espnet3_prefect import ConfigError
from espnet3_prefect.pipeline.lock import LOCK_NAME, LockedError, acquire
from tests.conftest import ROOT, toy_config, write_yaml
from tests.helpers.toy import read_lines

pytestmark = pytest.mark.slow
EXPECTED = lambda n: "".join(f"utt{i:05d} {3 * i * i}\n" for i in range(n))  # noqa: E731


def run_infer(tmp_path, cfg: dict, overrides=(), **kwargs):
    from espnet3_prefect.flows.infer import infer

    path = write_yaml(tmp_path / "inference.yaml", cfg)
    return infer(config=[str(path)], overrides=list(overrides), **kwargs)


def forward_counts(tmp_path) -> collections.Counter:
    return collections.Counter(int(line.split()[1]) for line in read_lines(tmp_path / "forward.log"))


def _task_run_state(flow_run_id, name, timeout_s: float = 30.0):
    """The state of the flow run's task run ``name``, once Prefect has recorded it: workers send task
    runs as events, which the server records a little later (at most ``timeout_s``)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            found = [t.state for t in runs if t.name == name]
            if found or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    assert found, f"no task run {name!r} recorded for flow run {flow_run_id} within {timeout_s} s"
    return found[0]


def unmarked_warnings(caplog) -> list[str]:
    """The warnings of :func:`mark_task_run_crashed` giving up on a task run."""
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("could not mark task run")]


def test_worker_killed_once_mid_shard_reruns_only_that_shard(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=20, num_shards=4, bad={7: f"kill_once:{tmp_path}/killed"})
    [summary] = run_infer(tmp_path, cfg)
    assert (tmp_path / "killed").exists()  # the fault did happen
    assert (tmp_path / "inference/test_a/y.scp").read_text() == EXPECTED(20)
    counts = forward_counts(tmp_path)
    # Reading item 7 killed the worker. With prefetch that read happens ahead, while forward runs on an
    # earlier item of split.1, so the items of split.1 ran once or twice (those before the kill again)...
    assert all(1 <= counts[i] <= 2 for i in range(5, 10))
    assert all(counts[i] == 1 for i in range(20) if not 5 <= i < 10)  # ...and the other shards once
    assert summary["shards_run"] == 4


@pytest.mark.parametrize("server", ["idle", "busy"])
def test_shard_that_always_kills_its_worker_fails_by_name_and_others_stay_done(
    prefect_server, tmp_path, caplog, server
):
    # The killer sits in the last shard: Dask also counts a death against tasks merely queued on
    # the dying worker, so with few allowed failures an innocent shard could be declared killed too.
    # "busy": the server records another run's task runs meanwhile (the full suite's session server
    # is busy like that), when the dead worker's Running event can be lost with it.
    cfg = toy_config(tmp_path, n=20, num_shards=4, bad={17: "kill_always"})
    neighbour = None
    if server == "busy":
        neighbour = subprocess.Popen(
            [sys.executable, "-m", "tests.helpers.busy_server", "60", "100"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(5)  # its first flow's task runs are being recorded
    try:
        with dask.config.set({"distributed.scheduler.allowed-failures": 2}):
            state = run_infer(tmp_path, cfg, return_state=True)
    finally:
        if neighbour is not None:
            neighbour.kill()
            neighbour.wait()
    assert state.is_failed()
    message = str(state.message) + str(state.result(raise_on_failure=False))
    assert "split.3 items [15, 20): its worker died while running it (KilledWorker)" in message
    out = tmp_path / "inference/test_a"
    assert all((out / f"split.{i}/done").is_file() for i in (0, 1, 2))
    assert not (out / "split.3/done").exists() and not (out / "y.scp").exists()
    assert not unmarked_warnings(caplog), unmarked_warnings(caplog)
    task_state = _task_run_state(state.state_details.flow_run_id, "run-shard-test_a-3")
    assert task_state.type.value == "CRASHED", task_state  # not left Running


ERROR_500 = b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


def _api_that_fails_first(api_url: str, failures: int) -> str:
    """An address for ``api_url`` whose first ``failures`` connections are answered 500 (a busy
    server's error that Prefect's client does not retry itself); later ones are forwarded."""
    import socket
    import threading
    from urllib.parse import urlsplit

    upstream = urlsplit(api_url)
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def pump(src, dst):
        with src, dst:
            while data := src.recv(65536):
                dst.sendall(data)

    def serve():
        for n in itertools.count():
            conn, _ = listener.accept()
            if n < failures:
                with conn:
                    conn.recv(65536)
                    conn.sendall(ERROR_500)
                continue
            far = socket.create_connection((upstream.hostname, upstream.port))
            for a, b in ((conn, far), (far, conn)):
                threading.Thread(target=pump, args=(a, b), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    return api_url.replace(f"{upstream.hostname}:{upstream.port}", f"127.0.0.1:{port}")


def test_a_dead_workers_task_run_is_marked_crashed_through_a_failing_api_call(prefect_server, caplog):
    import uuid

    from prefect import flow, get_client, task
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from espnet3_prefect.execution.run_states import mark_task_run_crashed

    @task
    def lost():
        pass

    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run(flow(lambda: None, name="lost-worker"))
    task_run_id = uuid.uuid4()  # never recorded: its worker died before sending a single event
    with temporary_settings(updates={PREFECT_API_URL: _api_that_fails_first(prefect_server, failures=2)}):
        mark_task_run_crashed(task_run_id, "its worker died", task=lost, name="lost-0", flow_run_id=flow_run.id)
    assert not unmarked_warnings(caplog), unmarked_warnings(caplog)
    with get_client(sync_client=True) as client:
        run = client.read_task_run(task_run_id)
    assert (run.name, run.flow_run_id, run.state.type.value) == ("lost-0", flow_run.id, "CRASHED")


def test_a_dead_workers_task_run_recorded_only_as_pending_is_marked_crashed_under_its_name(prefect_server, caplog):
    # A worker names its task run with a placeholder until it renders task_run_name as the run starts;
    # when only its Pending event arrived before it died, the server holds that placeholder.
    from prefect import flow, get_client, task
    from prefect.states import Pending

    from espnet3_prefect.execution.run_states import mark_task_run_crashed

    @task
    def lost():
        pass

    with get_client(sync_client=True) as client:
        flow_run = client.create_flow_run(flow(lambda: None, name="lost-worker"))
        pending = client.create_task_run(lost, flow_run.id, dynamic_key="a01", name="lost-a01", state=Pending())
    mark_task_run_crashed(pending.id, "its worker died", task=lost, name="lost-0", flow_run_id=flow_run.id)
    assert not unmarked_warnings(caplog), unmarked_warnings(caplog)
    with get_client(sync_client=True) as client:
        run = client.read_task_run(pending.id)
    assert (run.name, run.state.type.value) == ("lost-0", "CRASHED")


def test_marking_a_crash_gives_up_with_one_warning_when_the_api_keeps_failing(prefect_server, caplog):
    import uuid

    from prefect.settings import PREFECT_API_URL, temporary_settings

    from espnet3_prefect.execution.run_states import mark_task_run_crashed

    started = time.monotonic()
    with temporary_settings(updates={PREFECT_API_URL: _api_that_fails_first(prefect_server, failures=10**6)}):
        # it returns: the shard's own error is what the run reports
        mark_task_run_crashed(uuid.uuid4(), "its worker died", timeout_s=1.0)
    assert time.monotonic() - started < 30
    [warning] = unmarked_warnings(caplog)
    assert "500 Internal Server Error" in warning


def test_killed_flow_process_resumes_unfinished_shards_and_crashes_the_stale_run(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=24, num_shards=6, n_workers=1)
    cfg["model"]["sleep_s"] = 0.25
    path = write_yaml(tmp_path / "inference.yaml", cfg)
    code = f"from espnet3_prefect.flows.infer import infer; infer(config=[{str(path)!r}])"
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    out = tmp_path / "inference/test_a"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(list(out.glob("split.*/done"))) < 2:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the flow process and its workers, like a node failure
    proc.wait()
    done_before = len(list(out.glob("split.*/done")))
    assert 2 <= done_before < 6
    stale = json.loads((tmp_path / "inference" / LOCK_NAME).read_text())
    (tmp_path / "forward.log").unlink()
    [summary] = run_infer(tmp_path, cfg)
    assert summary["shards_cached"] == done_before and summary["shards_run"] == 6 - done_before
    assert (out / "y.scp").read_text() == EXPECTED(24)
    from prefect import get_client

    with get_client(sync_client=True) as client:
        assert client.read_flow_run(stale["flow_run_id"]).state.type.value == "CRASHED"


def test_failing_utterance_fails_the_shard_naming_it(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=10, num_shards=2, bad={7: "model_raise"})
    with pytest.raises(Exception, match="item 7 \\(utt_id='utt00007'\\): RuntimeError: model blew up"):
        run_infer(tmp_path, cfg)


def test_skip_policy_lists_failures_and_threshold_turns_too_many_into_failure(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=20, num_shards=2, batch_size=4, bad={7: "model_raise"})
    cfg["runner"].update(on_error="skip", max_failed_ratio=0.1)
    [summary] = run_infer(tmp_path, cfg)
    out = tmp_path / "inference/test_a"
    assert summary["failed"] == 1
    assert (out / "y.scp").read_text() == EXPECTED(20).replace("utt00007 147\n", "")
    [failure] = [json.loads(line) for line in read_lines(out / "failures.jsonl")]
    assert failure["item"] == "item 7 (utt_id='utt00007')" and "model blew up" in failure["error"]

    cfg["dataset"]["test"][0]["bad"] = {1: "model_raise", 7: "model_raise", 15: "model_raise"}
    with pytest.raises(Exception, match="3 of 20 items failed \\(15.0%\\), above runner.max_failed_ratio 0.1"):
        run_infer(tmp_path, cfg)
    assert not (out / "y.scp").exists()  # absent, with the reason above
    assert len(read_lines(out / "failures.jsonl")) == 3


def test_changed_batch_size_or_data_redoes_shards(prefect_server, tmp_path):
    version = tmp_path / "data_version"
    version.write_text("v1")
    cfg = toy_config(tmp_path, n=12, num_shards=3)
    cfg["dataset"]["test"][0]["version_file"] = str(version)
    run_infer(tmp_path, cfg)
    [same] = run_infer(tmp_path, cfg)
    assert same["shards_run"] == 0
    version.write_text("v2")  # the data changed, the config did not
    [redone] = run_infer(tmp_path, cfg)
    assert redone["shards_run"] == 3
    [rebatched] = run_infer(tmp_path, cfg, overrides=["batch_size=2"])
    assert rebatched["shards_run"] == 3
    assert (tmp_path / "inference/test_a/y.scp").read_text() == EXPECTED(12)


def test_concurrent_run_on_the_same_folder_is_refused(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=4, num_shards=1)
    holder = acquire(tmp_path / "inference", "other-run")
    try:
        with pytest.raises(LockedError, match=f"is in use by pid {os.getpid()} .*flow run other-run"):
            run_infer(tmp_path, cfg)
    finally:
        holder.release()
    assert not (tmp_path / "builds.log").exists()  # refused before any env was built


def test_truncated_shard_file_after_marker_is_redone(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=12, num_shards=3)
    run_infer(tmp_path, cfg)
    shard_file = tmp_path / "inference/test_a/split.1/y.scp"
    shard_file.write_text(shard_file.read_text()[:7])
    (tmp_path / "forward.log").unlink()
    [again] = run_infer(tmp_path, cfg)
    assert again["shards_run"] == 1 and sorted(forward_counts(tmp_path)) == list(range(4, 8))
    assert (tmp_path / "inference/test_a/y.scp").read_text() == EXPECTED(12)


def test_unwritable_or_full_inference_dir_fails_before_compute(prefect_server, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    cfg = toy_config(tmp_path, n=4, num_shards=1, inference_dir=str(blocker / "inference"))
    with pytest.raises(ConfigError, match="inference_dir: cannot write to .*a_file/inference/test_a: Not a directory"):
        run_infer(tmp_path, cfg)
    cfg = toy_config(tmp_path, n=4, num_shards=1)
    cfg["runner"]["min_free_mb"] = 10**12
    with pytest.raises(ConfigError, match="inference_dir: only \\d+ MB free on .*runner.min_free_mb asks for"):
        run_infer(tmp_path, cfg)
    assert not (tmp_path / "builds.log").exists()


@pytest.fixture
def small_fs(tmp_path):
    """A 16 MB tmpfs to fill (needs root and a mount namespace that allows it), else skip."""
    mount = tmp_path / "small_fs"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip() or done.returncode}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def _disk_full_run(tmp_path, cfg, full_path):
    """Run ``cfg`` into a disk that fills mid-run, in a process of its own (its output is what the
    user sees); check what the user gets; free the space; re-run."""
    n = cfg["dataset"]["test"][0]["n"]
    out = Path(cfg["inference_dir"]) / "test_a"
    path = write_yaml(tmp_path / "inference.yaml", cfg)
    code = f"from espnet3_prefect.flows.infer import infer; infer(config=[{str(path)!r}])"
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    lines = (proc.stdout + proc.stderr).splitlines()
    said = [x for x in lines if "o space left" in x or "disk quota" in x]
    print(f"disk-full run printed {len(lines)} lines; {len(said)} name the full disk")
    assert proc.returncode != 0
    assert full_path.exists()  # the fault did happen
    [flow_error] = [x for x in lines if "| ERROR   | Flow run" in x]
    assert f"no space left on device writing {out}/split." in flow_error, flow_error
    assert "MB free on that filesystem); free space and re-run: shards done so far are kept" in flow_error
    # Once or twice per shard already on a worker when the disk filled (Prefect logs the end of each
    # task run, and that it could not store its result), and the flow's error: bounded by the workers,
    # not by the shards. (Dask logs one line per shard it cancels.)
    assert len(said) <= 20 and len(lines) < 150, "\n".join(lines)
    assert not any("locked by" in x or "Retry " in x for x in lines), "\n".join(lines)
    assert max(forward_counts(tmp_path).values()) == 1  # not retried (runner.retries is 2)
    assert not list(out.rglob("lock")), "a shard lock was left behind"
    done = sorted(int(p.parent.name.split(".")[1]) for p in out.glob("split.*/done"))
    size = n // cfg["parallel"]["num_shards"]
    for index in done:  # a done marker only beside complete output
        assert (out / f"split.{index}/y.scp").read_text() == EXPECTED(n)[
            len(EXPECTED(index * size)) : len(EXPECTED((index + 1) * size))
        ]
    assert len(done) < cfg["parallel"]["num_shards"]

    full_path.unlink()  # space freed
    (tmp_path / "forward.log").unlink()
    [summary] = run_infer(tmp_path, cfg)
    assert summary["shards_cached"] == len(done)
    redo = [i for i in range(n) if i // size not in done]
    assert sorted(forward_counts(tmp_path)) == redo  # only what was missing, once each
    assert (out / "y.scp").read_text() == EXPECTED(n)
    assert not list(out.rglob("lock"))


def test_disk_filling_mid_run_names_the_path_once_and_a_rerun_redoes_only_the_rest(prefect_server, tmp_path, small_fs):
    filler = small_fs / "filler"
    cfg = toy_config(
        tmp_path, n=40, num_shards=20, bad={9: f"fill:{filler}"}, inference_dir=str(small_fs / "inference")
    )
    cfg["runner"].update(retries=2, retry_delay_s=[1, 1], min_free_mb=1)
    _disk_full_run(tmp_path, cfg, filler)


def test_injected_enospc_mid_run_names_the_path_once_and_a_rerun_redoes_only_the_rest(prefect_server, tmp_path):
    flag = tmp_path / "disk_full"
    cfg = toy_config(tmp_path, n=40, num_shards=20, bad={9: f"full:{flag}"})
    cfg["runner"].update(_target_="tests.helpers.toy.DiskFullRunner", retries=2, retry_delay_s=[1, 1])
    cfg["provider"]["params"]["full_flag"] = str(flag)
    _disk_full_run(tmp_path, cfg, flag)


def test_a_run_whose_workers_are_all_gone_for_good_stops_on_one_line_and_keeps_its_shards(prefect_server, tmp_path):
    """A running scheduler (``parallel.address``) with one worker of its own and no nanny: the shard
    that kills it leaves the scheduler with none, and Dask would wait for one forever (the run hung
    before ``parallel.no_worker_timeout_s``). The run stops after the wait, naming the cause; the
    shards done before are kept and a run on a new worker does only the rest."""
    from espnet3_prefect.server.process import free_port

    port = free_port()
    address = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_API_URL": prefect_server}
    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1", "--port", str(port),
         "--dashboard-address", ":0", "--no-show"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def worker():
        return subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, "--no-nanny", "--nthreads", "1",
             "--host", "127.0.0.1", "--no-dashboard"],
            env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip

    first = worker()
    try:
        cfg = toy_config(tmp_path, n=20, num_shards=4, bad={17: f"kill_once:{tmp_path}/killed"})
        cfg["parallel"] = {"address": address, "num_shards": 4, "no_worker_timeout_s": 3}
        started = time.monotonic()
        state = run_infer(tmp_path, cfg, return_state=True)
        waited_s = time.monotonic() - started
        assert first.wait(timeout=30) != 0 and (tmp_path / "killed").exists()  # the fault did happen
        assert state.is_failed()
        message = str(state.result(raise_on_failure=False))
        assert "test set 'test_a': no Dask worker for 3 s (the last, tcp://127.0.0.1:" in message, message
        assert "3 of the 4 shards it ran are done" in message and "run again to resume" in message
        assert waited_s < 120, waited_s  # a bound on the stop, not a timing: it hung before
        out = tmp_path / "inference/test_a"
        assert all((out / f"split.{i}/done").is_file() for i in (0, 1, 2))
        assert not (out / "split.3/done").exists() and not (out / "y.scp").exists()

        second = worker()
        try:
            [summary] = run_infer(tmp_path, cfg)
        finally:
            second.terminate()
            second.wait(timeout=30)
        assert (out / "y.scp").read_text() == EXPECTED(20)
        assert summary["shards_run"] == 1 and summary["shards_cached"] == 3
    finally:
        for proc in (first, scheduler):
            proc.terminate()
        for proc in (first, scheduler):
            proc.wait(timeout=30)


def test_the_no_worker_watch_waits_for_a_first_worker_and_then_for_none_to_come_back():
    """The rule of ``execution.worker_watch.NoWorkers`` on a real in-process cluster: a cluster that has not had
    a worker yet (a batch queue) is not judged; once it had one, none for the timeout cancels what the
    flow waits on and says why; a worker coming back within the timeout resets the clock."""
    from distributed import Client, LocalCluster

    from espnet3_prefect.execution.worker_watch import NoWorkers

    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster, Client(cluster) as client:
        waiting = client.submit(sum, [1], resources={"nowhere": 1})  # no worker has it: stays pending
        with NoWorkers(client, timeout_s=1.0) as watch:
            watch.cancels([waiting])
            time.sleep(3)
            assert watch.gone is None and not waiting.cancelled()  # never had a worker: not judged
            cluster.scale(1)
            client.wait_for_workers(1, timeout=30)
            time.sleep(1.5)  # seen
            cluster.scale(0)
            deadline = time.monotonic() + 30
            while watch.gone is None and time.monotonic() < deadline:
                time.sleep(0.2)
        assert watch.gone is not None and watch.gone.startswith("no Dask worker for 1 s (the last, ")
        assert "run again to resume" in watch.gone and "parallel.no_worker_timeout_s" in watch.gone
        deadline = time.monotonic() + 10
        while not waiting.cancelled() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert waiting.cancelled()
