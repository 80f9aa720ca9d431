"""Runs that stay open (issue 25): one address per project, and `--keep-server` on a finished stage
points at the run that wrote it instead of an empty new flow run."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.conftest import toy_config, write_yaml
from tests.helpers.procs import CLI, cli_env

pytestmark = pytest.mark.slow
LINK = r"http://127\.0\.0\.1:(\d+)/runs/flow-run/([0-9a-f-]{36})"


@pytest.fixture
def registry(tmp_path, monkeypatch):
    from espnet3_prefect.server.registry import list_servers, stop_servers

    monkeypatch.setenv("ESPNET3_PREFECT_REGISTRY", str(tmp_path / "registry"))
    yield list_servers
    outcome = stop_servers("all", force=True)
    assert outcome.busy == [] and list_servers() == []


def test_keep_server_on_a_finished_stage_points_at_the_run_that_wrote_it(tmp_path, registry):
    from espnet3_prefect.server.run_links import writer_runs

    cfg = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=6, n_workers=1, num_shards=2))
    env = {**cli_env(tmp_path / "home"), "ESPNET3_PREFECT_REGISTRY": os.environ["ESPNET3_PREFECT_REGISTRY"]}
    first = subprocess.run(
        [*CLI, "infer", "--config", str(cfg)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert first.returncode == 0, first.stderr[-3000:]
    [(port, run_id)] = re.findall(r"View at " + LINK, first.stderr)
    assert writer_runs([tmp_path / "inference"]) == [run_id]
    kept = subprocess.run(
        [*CLI, "infer", "--config", str(cfg), "--keep-server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert kept.returncode == 0, kept.stderr[-3000:]
    assert "Beginning flow run" not in kept.stderr  # no new, empty flow run
    assert re.findall(LINK, kept.stderr) == [(port, run_id)], kept.stderr  # same port, the run that wrote it
    assert "0 shards run, 2 cached" in kept.stdout
    [server] = registry()
    assert server.ui_url == f"http://127.0.0.1:{port}"
