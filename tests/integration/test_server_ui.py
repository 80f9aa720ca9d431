"""The Prefect UI of every server we start talks to that server: ``GET /ui-settings`` names its own API.

Prefect's UI asks ``/ui-settings`` where its API is. Without ``PREFECT_SERVER_UI_API_URL`` a server on
any port but 4200 answers ``http://127.0.0.1:4200/api``: the flow-run link we print opened a blank
page ("Can't connect to Server API"), or another server's runs. Real servers, free ports, 127.0.0.1.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.request

import pytest

from tests.helpers.procs import CLI, ROOT, cli_env, pid_alive

pytestmark = pytest.mark.slow


def ui_settings(ui_url: str) -> dict:
    with urllib.request.urlopen(f"{ui_url}/ui-settings", timeout=20) as resp:
        return json.load(resp)


def test_embedded_server_ui_names_its_own_api(tmp_path, monkeypatch):
    from espnet3_prefect.server import prefect_api

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("ESPNET3_PREFECT_REGISTRY", str(tmp_path / "registry"))
    with prefect_api(tmp_path / "home") as api_url:  # what `espnet3-prefect infer` runs under
        assert api_url.startswith("http://127.0.0.1:") and not api_url.startswith("http://127.0.0.1:4200/")
        settings = ui_settings(api_url[: -len("/api")])
    assert settings["api_url"] == api_url


def test_deploy_local_server_ui_names_its_own_api(tmp_path):
    from espnet3_prefect.server import free_port

    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(ROOT / "prefect.yaml", project)
    for folder in ("flows", "recipes", "deployments"):
        shutil.copytree(ROOT / folder, project / folder, ignore=shutil.ignore_patterns("__pycache__"))
    home = tmp_path / "home"
    env = {**cli_env(home), "ESPNET3_PREFECT_REGISTRY": str(tmp_path / "registry")}
    port = free_port()
    proc = subprocess.run([*CLI, "deploy-local", "--port", str(port), "--project-dir", str(project)],
                          env=env, capture_output=True, text=True, timeout=400)
    state_file = home / "deploy-local.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else None
    try:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert state["ui_url"] == f"http://127.0.0.1:{port}"
        assert ui_settings(state["ui_url"])["api_url"] == f"http://127.0.0.1:{port}/api"
    finally:
        stop = subprocess.run([*CLI, "deploy-local", "--stop"], env=env, capture_output=True, text=True, timeout=120)
        if state is not None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and (pid_alive(state["worker_pid"]) or pid_alive(state["server_pid"])):
                time.sleep(0.5)
            assert not pid_alive(state["server_pid"]), stop.stdout + stop.stderr
    assert not os.listdir(tmp_path / "registry")  # the record went with the server
