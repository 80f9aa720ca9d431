"""The flow-run link the CLI prints, opened in a real headless Chromium.

`espnet3-prefect infer --keep-server` on the toy recipe (embedded server: free port, UI on), then the
"View at http://127.0.0.1:<port>/runs/flow-run/<id>" URL from its output is opened and the page must
show the run: its logs, its task runs (run-shard-<test>-N) and the summary artifact, and never "Can't connect
to Server API"; the workers' chart renders in the Artifacts tab (its picture: test-artifacts/browser/
throughput-chart.png; docs/_static/ui-throughput-chart.png was taken by this test). On failure a
screenshot, the page text and its HTML go to test-artifacts/browser/ ($E3P_TEST_ARTIFACTS). Skipped
without Chromium unless E3P_REQUIRE_BROWSER=1 (CI sets it).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import toy_config, write_yaml
from tests.helpers.browser import Browser, BrowserError, find_chromium
from tests.helpers.procs import CLI, ROOT, cli_env

pytestmark = [pytest.mark.slow, pytest.mark.browser]
ARTIFACTS = Path(os.environ.get("E3P_TEST_ARTIFACTS", ROOT / "test-artifacts")) / "browser"


@pytest.fixture
def chromium() -> str:
    found = find_chromium()
    if found is None:
        message = "Chromium not installed (apt-get install chromium)"
        if os.environ.get("E3P_REQUIRE_BROWSER") == "1":
            pytest.fail(message + "; E3P_REQUIRE_BROWSER=1")
        pytest.skip(message)
    return found


@pytest.fixture
def kept_servers(tmp_path, monkeypatch):
    """The servers the CLI leaves running are recorded in a registry of this test's own; stopped after."""
    from espnet3_prefect.server.registry import list_servers, stop_servers

    monkeypatch.setenv("ESPNET3_PREFECT_REGISTRY", str(tmp_path / "registry"))
    yield list_servers
    outcome = stop_servers("all", force=True)
    assert outcome.busy == [] and list_servers() == []


def test_flow_run_link_printed_by_the_cli_shows_the_run_in_chromium(tmp_path, chromium, kept_servers, request):
    cfg = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=8, n_workers=1, num_shards=2))
    env = {**cli_env(tmp_path / "home"), "ESPNET3_PREFECT_REGISTRY": os.environ["ESPNET3_PREFECT_REGISTRY"]}
    started = time.monotonic()
    proc = subprocess.run(
        [*CLI, "infer", "--config", str(cfg), "--keep-server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    links = re.findall(r"View at (http://127\.0\.0\.1:\d+/runs/flow-run/[0-9a-f-]{36})", proc.stdout + proc.stderr)
    assert links, "the CLI printed no flow-run link:\n" + proc.stderr[-3000:]
    url = links[0]
    [server] = kept_servers()
    assert url.startswith(server.ui_url + "/")
    with urllib.request.urlopen(f"{server.ui_url}/ui-settings", timeout=20) as resp:
        assert json.load(resp)["api_url"] == server.api_url  # the UI asks this server, no other
    cli_s = time.monotonic() - started

    browser_started = time.monotonic()
    with Browser(chromium) as page:
        try:
            page.goto(url)
            # The run's header and its Logs tab (open by default): the flow's own log lines.
            text = page.wait_for_text(
                "Completed",
                "Task Runs",
                "Artifacts",
                "Beginning flow run",
                "split.0: 4 items",
                "merged 2 shards",
                "summary:",
                timeout_s=90,
            )
            assert "Can't connect" not in text and "No flow runs" not in text
            assert page.click_text("Task Runs")
            page.wait_for_text("run-shard-test_a-0", "run-shard-test_a-1", "merge-test_a", timeout_s=60)
            assert page.click_text("Artifacts")
            page.wait_for_text("infer-summary", "infer: per test set shards, items, seconds, items/s", timeout_s=60)
            assert page.click_text("infer-summary")  # the table itself, on the artifact's page
            page.wait_for_text("items_per_s", "shards_run", "test_a", timeout_s=60)
            # the workers' chart (matplotlib, inlined as a data: PNG) renders in the UI's markdown
            page.goto(url)
            page.wait_for_text("Artifacts", timeout_s=60)
            assert page.click_text("Artifacts")
            page.wait_for_text("throughput-test-a-plot", timeout_s=60)
            assert page.click_text("throughput-test-a-plot")
            page.wait_for_text("test_a: items per worker-second, by worker", timeout_s=60)
            assert _rendered_png_sizes(page) == [[800, 400]]
            chart_screenshot(page, ARTIFACTS / "throughput-chart.png")
        except BaseException:
            keep_evidence(page, request.node.name)
            raise
    print(f"\nCLI run {cli_s:.1f} s; Chromium start + 4 pages {time.monotonic() - browser_started:.1f} s")


def _rendered_png_sizes(page: Browser, timeout_s: float = 30) -> list:
    """The natural (width, height) of each inlined PNG the page shows, once every one has loaded."""
    expression = (
        "Array.from(document.images).filter(i => i.src.startsWith('data:image/png'))"
        ".map(i => [i.complete, i.naturalWidth, i.naturalHeight])"
    )
    deadline = time.monotonic() + timeout_s
    images = []
    while time.monotonic() < deadline:
        images = page.evaluate(expression) or []
        if images and all(done and width for done, width, _ in images):
            break
        time.sleep(0.5)
    return [[width, height] for _, width, height in images]


def chart_screenshot(page: Browser, path: Path, margin: int = 24) -> Path:
    """The page as the UI renders it, from its top to just below its first inlined chart (its header
    says which run and artifact it is), cropped to the chart's right edge, in 256 colours: a picture
    for the docs. The UI scrolls inside its own pane, so the viewport is made tall enough first."""
    import base64
    import io

    from PIL import Image

    locate = (
        "(() => { const i = [...document.images].find(i => i.src.startsWith('data:image/png'));"
        " if (!i) return null; const r = i.getBoundingClientRect(); return [r.right, r.bottom]; })()"
    )
    box = page.evaluate(locate)
    assert box, "no inlined chart on the page"
    width = page.evaluate("window.innerWidth")
    metrics = {"width": width, "deviceScaleFactor": 1, "mobile": False}
    page.call("Emulation.setDeviceMetricsOverride", {**metrics, "height": int(box[1]) + 2 * margin})
    time.sleep(1)  # the layout settles at the new height
    right, bottom = page.evaluate(locate)
    clip = {"x": 0, "y": 0, "width": min(width, int(right) + margin), "height": int(bottom) + margin, "scale": 1}
    data = page.call("Page.captureScreenshot", {"format": "png", "clip": clip})["data"]
    image = Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB").quantize(colors=256)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG", optimize=True)
    return path


def keep_evidence(page: Browser, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    for what, save in (
        ("png", lambda p: page.screenshot(p)),
        ("txt", lambda p: p.write_text(page.text())),
        ("html", lambda p: p.write_text(page.evaluate("document.documentElement.outerHTML") or "")),
    ):
        try:
            save(ARTIFACTS / f"{name}.{what}")
        except Exception as exc:  # the evidence must never hide the failure
            print(f"could not save the {what}: {exc}")
    print(f"browser evidence: {ARTIFACTS}/{name}.{{png,txt,html}}")


def spki_pin(cert_file: Path) -> str:
    """Chromium's pin of a certificate's public key: base64 of the SHA-256 of its SubjectPublicKeyInfo."""
    import base64
    import hashlib

    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    key = x509.load_pem_x509_certificate(cert_file.read_bytes()).public_key()
    der = key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return base64.b64encode(hashlib.sha256(der).digest()).decode()


def test_the_ui_over_https_beyond_loopback_shows_the_run_in_chromium(tmp_path, chromium, kept_servers, request):
    """``--server-host`` (HTTPS, basic auth): the flow-run link is https://, Chromium refuses the page until it
    trusts this server start's key (pinned, nothing else accepted), then the UI logs in and shows the run."""
    from espnet3_prefect.disk.client_file import client_file, read_client_file
    from tests.integration.test_security_api import non_loopback_address

    address = non_loopback_address()
    home = tmp_path / "home"
    cfg = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=8, n_workers=1, num_shards=2))
    env = {**cli_env(home), "ESPNET3_PREFECT_REGISTRY": os.environ["ESPNET3_PREFECT_REGISTRY"]}
    proc = subprocess.run(
        [*CLI, "infer", "--config", str(cfg), "--keep-server", "--server-host", address],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [server] = kept_servers()
    links = re.findall(
        rf"View at (https://{re.escape(address)}:\d+/runs/flow-run/[0-9a-f-]{{36}})", proc.stdout + proc.stderr
    )
    assert links and links[0].startswith(server.ui_url + "/"), proc.stderr[-3000:]
    creds = read_client_file(client_file(home))
    with Browser(chromium) as page:  # trusts only the system's authorities: the page does not open
        with pytest.raises(BrowserError, match="ERR_CERT_AUTHORITY_INVALID"):
            page.goto(server.ui_url + "/")
    pin = spki_pin(Path(creds.ssl_cert_file).with_name("cert.pem"))
    with Browser(chromium, extra_flags=(f"--ignore-certificate-errors-spki-list={pin}",)) as page:
        try:
            page.goto(server.ui_url + "/")
            page.wait_for_text("Login", timeout_s=60)  # the UI over HTTPS asks for the credential
            # What the login form stores, set over DevTools (never on a command line).
            page.evaluate(f"localStorage.setItem('prefect-password', btoa({json.dumps(creds.auth_string)}))")
            page.goto(links[0])
            text = page.wait_for_text("Completed", "Task Runs", "Beginning flow run", timeout_s=90)
            assert "Can't connect" not in text
            assert page.evaluate("location.protocol") == "https:"
            assert page.click_text("Task Runs")
            page.wait_for_text("run-shard-test_a-0", "run-shard-test_a-1", timeout_s=60)
        except BaseException:
            keep_evidence(page, request.node.name)
            raise


def test_a_link_printed_by_a_finished_run_opens_after_it_ended(tmp_path, chromium, kept_servers, request):
    """Issue 25: a run's "View at" link outlives the run. The CLI run stops its server when it ends;
    `espnet3-prefect ui` serves the project's state again on the same port, and the very link the run
    printed shows that run and its task runs."""
    cfg = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=8, n_workers=1, num_shards=2))
    env = {**cli_env(tmp_path / "home"), "ESPNET3_PREFECT_REGISTRY": os.environ["ESPNET3_PREFECT_REGISTRY"]}
    proc = subprocess.run(
        [*CLI, "infer", "--config", str(cfg)], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    [url] = re.findall(r"View at (http://127\.0\.0\.1:\d+/runs/flow-run/[0-9a-f-]{36})", proc.stderr)
    assert kept_servers() == [] and not (tmp_path / "home/server.json").exists()  # the run's server is gone
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=5)
    ui = subprocess.run(
        [*CLI, "ui", str(tmp_path / "inference"), "--keep-server"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert ui.returncode == 0, ui.stderr[-3000:]
    assert f"  {url}  infer/" in ui.stdout, ui.stdout  # the same address: the printed link is valid again
    assert ui.stdout.count(url) == 2  # as the run that wrote the folder, and among the recent runs
    with Browser(chromium) as page:
        try:
            page.goto(url)
            text = page.wait_for_text("Completed", "Task Runs", "Beginning flow run", timeout_s=90)
            assert "Can't connect" not in text
            assert page.click_text("Task Runs")
            page.wait_for_text("run-shard-test_a-0", "run-shard-test_a-1", "merge-test_a", timeout_s=60)
        except BaseException:
            keep_evidence(page, request.node.name)
            raise


def test_a_recipe_run_shows_its_stages_as_children_in_chromium(tmp_path, chromium, request):
    """Issue 47: the flow ``recipe`` in the UI. The recipe is tests/unit/test_recipe_stages.py's small
    system, whose ``infer`` stage runs the real ``infer`` flow on the toy recipe (a subflow run with its
    shards on a local cluster), run in a process of its own against a server of this test's: the
    parent shows its stages' task runs, the subflow run, the stage table; a re-run shows every stage
    Cached. Screenshots: test-artifacts/browser/recipe-*.png (those of docs/_static/ui-recipe-*.png
    were taken by this test)."""
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from espnet3_prefect.server.process import start_server, stop_server
    from tests.helpers.prefect_db import seed

    toy = write_yaml(tmp_path / "toy.yaml", toy_config(tmp_path / "toy", n=8, n_workers=1, num_shards=2))
    (tmp_path / "recipe").mkdir()
    server, api_url = start_server(seed(tmp_path / "server"), ui=True)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(PREFECT_API_URL=api_url, PYTHONPATH=str(ROOT))
        proc = subprocess.run(
            [sys.executable, "-c", RECIPE_RUNS, str(toy)],
            cwd=tmp_path / "recipe",
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        first, again = json.loads(proc.stdout.strip().splitlines()[-1])

        def recorded(flow_run_id, n):  # the server writes task runs from their events, each second
            deadline = time.monotonic() + 120
            with SyncPrefectClient(api_url) as client:
                while time.monotonic() < deadline:
                    found = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
                    if len([run for run in found if run.state and run.state.is_final()]) >= n:
                        return
                    time.sleep(1)
            pytest.fail(f"the server recorded fewer than {n} finished task runs of {flow_run_id}")

        recorded(first, 2)  # create_dataset, train (infer is its subflow run, measure runs in the flow)
        recorded(again, 4)
        ui = api_url.removesuffix("/api")
        with Browser(chromium) as page:
            try:
                page.goto(f"{ui}/runs/flow-run/{first}")
                page.wait_for_text("toy/asr", "Completed", "create_dataset: runs", timeout_s=90)
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                page.screenshot(ARTIFACTS / "recipe-first-run.png")
                assert page.click_text("Task Runs")
                page.wait_for_text("create_dataset", "train", timeout_s=60)
                assert page.click_text("Subflow Runs")
                page.wait_for_text("infer", timeout_s=60)
                assert page.click_text("Artifacts")
                page.wait_for_text("recipe-stages", timeout_s=60)
                page.goto(f"{ui}/runs/flow-run/{again}")
                page.wait_for_text("toy/asr", "Completed", timeout_s=90)
                assert page.click_text("Task Runs")
                text = page.wait_for_text("Cached", "create_dataset", "measure", timeout_s=60)
                assert text.count("Cached") >= 4, text[-2000:]
                page.screenshot(ARTIFACTS / "recipe-rerun-cached.png")
            except BaseException:
                keep_evidence(page, request.node.name)
                raise
    finally:
        stop_server(server.pid)


def test_the_evaluate_trend_chart_renders_in_chromium(tmp_path, chromium, request):
    """The ``evaluate-trend`` artifact's chart (matplotlib, inlined as a data: PNG) in the UI: two
    evaluate runs of tests/helpers/wordrecipe.py's word recognizer (a perfect checkpoint, then one
    dropping every 3rd word), in a process of their own against a server of this test's; the
    artifact's page shows the table and the 800 x 400 chart. Picture: test-artifacts/browser/
    evaluate-trend.png (docs/_static/ui-evaluate-trend.png was taken by this test)."""
    from prefect.client.orchestration import SyncPrefectClient

    from espnet3_prefect.server.process import start_server, stop_server
    from tests.helpers.api_reads import latest_artifact
    from tests.helpers.prefect_db import seed
    from tests.helpers.wordrecipe import word_config

    ckpt = tmp_path / "model.ckpt"
    icfg = write_yaml(tmp_path / "inference.yaml", word_config(tmp_path, n=10, checkpoint=ckpt))
    mcfg = write_yaml(
        tmp_path / "metrics.yaml",
        {
            "metrics": [
                {
                    "metric": {"_target_": "espnet3.systems.esp2_asr.metrics.wer.WER"},
                    "inputs": {"ref": "dataset:text", "hyp": "hyp"},
                }
            ]
        },
    )
    server, api_url = start_server(seed(tmp_path / "server"), ui=True)
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
        env.update(PREFECT_API_URL=api_url, PYTHONPATH=str(ROOT))
        proc = subprocess.run(
            [sys.executable, "-c", EVALUATE_RUNS, str(icfg), str(mcfg), str(ckpt)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        with SyncPrefectClient(api_url) as client:
            trend = latest_artifact(client, "evaluate-trend")
        assert trend is not None and trend.data.count("\n| 20") == 2  # one row per run
        ui = api_url.removesuffix("/api")
        with Browser(chromium) as page:
            try:
                page.goto(f"{ui}/artifacts/artifact/{trend.id}")
                page.wait_for_text("evaluate-trend", "WER", "dev", timeout_s=90)
                assert _rendered_png_sizes(page) == [[800, 400]]
                chart_screenshot(page, ARTIFACTS / "evaluate-trend.png")
            except BaseException:
                keep_evidence(page, request.node.name)
                raise
    finally:
        stop_server(server.pid)


# Two evaluate runs, the second on a new checkpoint at the same path (argv: inference config, metrics
# config, checkpoint file).
EVALUATE_RUNS = """
import sys
from pathlib import Path

from espnet3_prefect.flows.evaluate import evaluate

if __name__ == "__main__":
    icfg, mcfg, ckpt = sys.argv[1:4]
    for k in ("0", "3"):
        Path(ckpt).write_text(k + "\\n")
        evaluate(infer_config=[icfg], metrics_config=[mcfg])
"""


# The recipe run and its re-run, in a process of its own (Prefect's event and log workers are this
# process's, bound to the first API they met): prints the two flow run ids as JSON.
RECIPE_RUNS = """
import json, sys

from espnet3_prefect.config.load import load_config
from espnet3_prefect.entry import infer
from tests.integration.test_recipe_flow import run_flow
from tests.unit.test_recipe_stages import recipe_run

if __name__ == "__main__":
    toy = load_config([sys.argv[1]])
    first = recipe_run()
    original = first.run_stage

    def with_a_real_infer(stage):
        if stage == "infer":
            infer(toy)  # the flow `infer`, a subflow run of the recipe's
        original(stage)

    first.run_stage = with_a_real_infer
    ran = run_flow(first)
    again = run_flow(recipe_run())
    assert ran.is_completed() and again.is_completed(), (ran, again)
    print(json.dumps([str(ran.state_details.flow_run_id), str(again.state_details.flow_run_id)]))
"""
