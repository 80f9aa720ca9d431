"""A kept server stopped on purpose first lets its task-run recorder catch up (:mod:`espnet3_prefect.server.drain`):
what a finished run sent is all there when the server is started again on the same state dir."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import toy_config, write_yaml
from tests.helpers.procs import CLI, cli_env, pid_alive

pytestmark = pytest.mark.slow


def test_servers_stop_right_after_a_run_loses_none_of_its_task_runs(tmp_path, monkeypatch):
    from prefect.client.orchestration import SyncPrefectClient

    from espnet3_prefect.server.process import start_server, stop_server

    shards = 12
    cfg = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=shards, num_shards=shards))
    home = tmp_path / "home"
    env = cli_env(home)
    monkeypatch.setenv("ESPNET3_PREFECT_REGISTRY", env["ESPNET3_PREFECT_REGISTRY"])
    run = subprocess.run(
        [*CLI, "infer", "--config", str(cfg), "--keep-server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    info = json.loads((home / "server.json").read_text())
    stop = subprocess.run(
        [*CLI, "servers", "--stop", str(info["pid"])], env=env, capture_output=True, text=True, timeout=120
    )
    assert stop.returncode == 0, stop.stderr[-2000:]
    assert not pid_alive(info["pid"])
    proc, api_url = start_server(home, ui=False)  # the same database, nothing sending
    try:
        with SyncPrefectClient(api_url) as client:
            runs = [t for t in client.read_task_runs(limit=200) if t.name.startswith("run-shard-")]
        assert len(runs) == shards
        assert all(t.state is not None and t.state.is_completed() for t in runs)
    finally:
        stop_server(proc.pid)


def test_drain_of_a_server_that_does_not_answer_says_so():
    from espnet3_prefect.server.drain import drain
    from espnet3_prefect.server.process import free_port

    assert drain(f"http://127.0.0.1:{free_port()}/api", limit_s=30) is False
