"""The command line on the embedded default: one local Prefect server, shared, stopped at the end."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.conftest import toy_config, write_yaml
from tests.helpers.procs import CLI, cli_env, pid_alive

pytestmark = pytest.mark.slow


def test_cli_embedded_server_runs_flow_records_workers_and_stops(tmp_path):
    cfg = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=8, num_shards=2))
    home = tmp_path / "home"
    proc = subprocess.run(
        [*CLI, "infer", "--config", str(cfg), "parallel.n_workers=2", "--keep-server"],
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "test_a: 8 items, 2 shards run, 0 cached" in proc.stdout
    info = json.loads((home / "server.json").read_text())
    assert info["api_url"].startswith("http://127.0.0.1:")
    try:
        from prefect.client.orchestration import SyncPrefectClient

        with SyncPrefectClient(info["api_url"]) as client:
            names = {t.name for t in client.read_task_runs()}
        assert {"run-shard-test_a-0", "run-shard-test_a-1"} <= names  # worker task runs landed on the one server
        assert "database is locked" not in proc.stderr
        ui = info["api_url"][: -len("/api")]
        assert (
            f"Prefect server left running (pid {info['pid']}, state {home}):\n  UI:   {ui}\n"
            f"  stop: espnet3-prefect servers --stop {ui}" in proc.stderr
        )
        listing = subprocess.run([*CLI, "servers"], env=cli_env(home), capture_output=True, text=True, timeout=60)
        assert listing.returncode == 0 and f"{info['pid']}  {ui}" in listing.stdout, listing.stdout
        stop = subprocess.run(
            [*CLI, "servers", "--stop", f"{ui}/runs/flow-run/x"],
            env=cli_env(home),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert stop.stdout.strip() == f"stopped the server at {ui} (pid {info['pid']})", stop.stdout + stop.stderr
        assert not pid_alive(info["pid"])
        again = subprocess.run(
            [*CLI, "servers", "--stop", ui], env=cli_env(home), capture_output=True, text=True, timeout=60
        )
        assert again.returncode == 1 and f"no running espnet3-prefect server matches {ui!r}" in again.stdout
    finally:
        from espnet3_prefect.server.process import stop_server

        stop_server(info["pid"])
    assert not pid_alive(info["pid"])


def test_cli_stops_the_server_it_started(tmp_path):
    cfg = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=4, n_workers=1, num_shards=1))
    home = tmp_path / "home"
    proc = subprocess.run(
        [*CLI, "infer", "--config", str(cfg)],
        env=cli_env(home),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not (home / "server.json").exists()
    assert (tmp_path / "inference/test_a/y.scp").read_text().startswith("utt00000 0\n")
    # Every shard is cached now; local_gpu still fails before a server starts (here: no dask-cuda, or no GPU).
    # No GPU visible: said first (not the [gpu] extra, which would not help), exit 2 as config errors do.
    gpu = subprocess.run(
        [*CLI, "infer", "--config", str(cfg), "parallel.env=local_gpu"],
        env={**cli_env(home), "CUDA_VISIBLE_DEVICES": ""},
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert gpu.returncode == 2 and "Prefect API" not in gpu.stderr and len(gpu.stderr.strip().splitlines()) == 1
    assert gpu.stderr.startswith("error: parallel.env: 'local_gpu' needs a GPU and none is visible"), gpu.stderr
    assert "[gpu]" not in gpu.stderr


def test_cli_bad_config_is_one_line_exit_2_and_starts_nothing(tmp_path):
    cfg = toy_config(tmp_path)
    cfg["parallel"]["env"] = "slrum"
    path = write_yaml(tmp_path / "inference.yaml", cfg)
    home = tmp_path / "home"
    started = time.monotonic()
    proc = subprocess.run(
        [*CLI, "infer", "--config", str(path)], env=cli_env(home), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: parallel.env: unknown backend 'slrum'; valid values: local, local_gpu, slurm, pbs, sge, "
        "lsf, htcondor, moab, oar, ssh, kube"
    ]
    assert not (home / "server.json").exists() and not (tmp_path / "inference").exists()
    assert time.monotonic() - started < 30
