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
