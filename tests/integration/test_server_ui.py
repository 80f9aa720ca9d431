"""The Prefect UI of every server we start talks to that server: ``GET /ui-settings`` names its own API.

Prefect's UI asks ``/ui-settings`` where its API is. Without ``PREFECT_SERVER_UI_API_URL`` a server on
any port but 4200 answers ``http://127.0.0.1:4200/api``: the flow-run link we print opened a blank
page ("Can't connect to Server API"), or another server's runs. Real servers, free ports, 127.0.0.1.
deploy-local's server (same start_server) is checked in tests/integration/test_deployments.py's fixture,
which starts one anyway; the browser test opens a page of the embedded one (test_browser_ui.py).
"""

from __future__ import annotations

import json
import urllib.request

import pytest

from tests.helpers.prefect_db import seed

pytestmark = pytest.mark.slow


def ui_settings(ui_url: str) -> dict:
    with urllib.request.urlopen(f"{ui_url}/ui-settings", timeout=20) as resp:
        return json.load(resp)


def test_embedded_server_ui_names_its_own_api(tmp_path, monkeypatch):
    from espnet3_prefect.server.embedded import prefect_api

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("ESPNET3_PREFECT_REGISTRY", str(tmp_path / "registry"))
    with prefect_api(tmp_path / "home") as api_url:  # what `espnet3-prefect infer` runs under
        assert api_url.startswith("http://127.0.0.1:") and not api_url.startswith("http://127.0.0.1:4200/")
        settings = ui_settings(api_url[: -len("/api")])
    assert settings["api_url"] == api_url


def _server_environ(pid: int) -> dict[str, str]:
    raw = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def test_a_runs_own_server_runs_only_what_a_run_uses_and_still_shows_all_of_it(tmp_path, monkeypatch):
    """A CLI run's embedded server starts without the deployment services (scheduler, late runs,
    foreman, pause and cancellation sweeps, repossessor) and writes events in batches; the run's task
    runs (all completed), their logs, the progress artifact and the summary table are all in the
    project's API after the run, its server stopped."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )

    from espnet3_prefect._internal.util import read_json
    from espnet3_prefect.flows.infer import infer
    from espnet3_prefect.server.embedded import _flush_prefect, prefect_api
    from espnet3_prefect.server.services import RUN_ONLY_OFF
    from tests.conftest import toy_config, write_yaml

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("ESPNET3_PREFECT_REGISTRY", str(tmp_path / "registry"))
    path = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=20, num_shards=4))
    with prefect_api(tmp_path / "home", ui=False):
        info = read_json(tmp_path / "home" / "server.json")
        assert info["services"] == "run"
        environ = _server_environ(info["pid"])
        assert {environ.get(f"PREFECT_SERVER_SERVICES_{name}_ENABLED") for name in RUN_ONLY_OFF} == {"false"}
        assert "PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_ENABLED" not in environ  # task runs are recorded
        assert environ["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE"] == "50"  # in batches
        state = infer(config=[str(path)], return_state=True)
        assert state.is_completed()
        run_id = state.state_details.flow_run_id
    # the run's server stopped when the run ended; what it took in is in the project's database (the
    # next run's server, the UI) in full: nothing batched was lost on the way out
    with prefect_api(tmp_path / "home", ui=False):
        _flush_prefect()
        with get_client(sync_client=True) as client:
            deadline = time.monotonic() + 10
            while True:  # (not a wait for the recorder: it stopped with the first server)
                runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
                shards = sorted(r.name for r in runs if r.name.startswith("run-shard"))
                if (
                    len(shards) == 4 and all(r.state and r.state.is_completed() for r in runs)
                ) or time.monotonic() > deadline:
                    break
                time.sleep(0.5)
            logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
            artifacts = client.read_artifacts(
                artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id]))
            )
    assert shards == [f"run-shard-test_a-{i}" for i in range(4)]
    assert all(r.state.is_completed() for r in runs) and {"build-env"} <= {r.name.split("-test")[0] for r in runs}
    messages = "\n".join(log.message for log in logs)
    for i in range(4):
        assert f"split.{i}: 5 items" in messages  # each shard's own log line, from the worker
    assert "summary:" in messages
    progress = [a for a in artifacts if a.type == "progress"]
    assert len(progress) == 1 and progress[0].data == 100.0
    assert any(a.key == "infer-summary" and a.type == "table" for a in artifacts)


def test_a_new_server_is_asked_once_for_a_path_no_route_answers_past_its_auth(tmp_path, monkeypatch):
    """Right after a server is healthy, ``warm_routes`` asks it for a path no route answers, so that
    FastAPI prepares every route then and not on the run's first requests: on a server that asks
    for basic auth the question carries the credentials and reaches the routes (404), where one
    without them stops at the door (401)."""
    from espnet3_prefect.server.auth import new_auth_string
    from espnet3_prefect.server.process import start_server, stop_server, warm_routes

    monkeypatch.setenv("ESPNET3_PREFECT_REGISTRY", str(tmp_path / "registry"))
    auth = new_auth_string()
    proc, api_url = start_server(seed(tmp_path / "home"), ui=False, auth_string=auth, services="run")
    try:
        answers = [warm_routes(api_url, auth_string=auth), warm_routes(api_url)]
        for thread in answers:
            thread.join(60)
        assert [thread.status for thread in answers] == [404, 401]
    finally:
        stop_server(proc.pid)


def test_the_stages_of_one_launch_share_one_server_stopped_at_its_end(tmp_path, monkeypatch):
    """``launch`` runs infer, then measure, each under its own ``prefect_api``: inside ``one_server``
    the second finds the first's server still up and uses it (one start, not two); at the end of
    ``one_server`` it is stopped. Outside it, a stage's server stops with the stage, as before."""
    from espnet3_prefect._internal.proc import pid_alive
    from espnet3_prefect.server.embedded import one_server, prefect_api, running_server

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("ESPNET3_PREFECT_REGISTRY", str(tmp_path / "registry"))
    home = tmp_path / "home"
    with one_server():
        with prefect_api(home, ui=False) as first:
            pid = running_server(home)["pid"]
        assert running_server(home)["pid"] == pid  # left up for the next stage
        with prefect_api(home, ui=False) as second:
            assert second == first and running_server(home)["pid"] == pid
    assert running_server(home) is None and not pid_alive(pid)
    with prefect_api(home, ui=False):
        pid = running_server(home)["pid"]
    assert running_server(home) is None and not pid_alive(pid)
