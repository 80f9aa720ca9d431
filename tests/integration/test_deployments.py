"""Deployments for real: `espnet3-prefect deploy-local` (a real Prefect server and a real process
worker on 127.0.0.1, free port), `prefect deploy --all` from prefect.yaml, then
`prefect deployment run` of infer/local, evaluate/local and metrics/local to completion, bad
parameters failing at once, `infer --detach` from another folder, the nightly cron schedule, and
everything stopped after.

The project is a copy of the checkout's deployment files in a temp folder (a "fresh clone": no
demo data), so the runs write there and the flow generates the demo audio itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.helpers.postgres import DATABASES
from tests.helpers.procs import CLI, deploy_local

pytestmark = pytest.mark.slow
PREFECT = str(Path(sys.executable).with_name("prefect"))
WER_T = "espnet3.systems.esp2_asr.metrics.wer.WER"
CER_T = "espnet3.systems.esp2_asr.metrics.cer.CER"


@pytest.fixture(scope="module", params=DATABASES)
def deployed(request, tmp_path_factory):
    """deploy-local on a copy of the project; yields (project, env, state); stopped after. Once on
    SQLite, once on PostgreSQL (``--database``; only the tests marked ``postgres``: deployment runs on
    PostgreSQL are those of test_checkpoint_events and test_security_api, the CI time kept small)."""
    base = tmp_path_factory.mktemp("deploy")
    home = base / "home"
    started = time.monotonic()
    with deploy_local(base, database=request.param) as (proc, state, env):
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert "ready in" in proc.stdout and "stop:    espnet3-prefect deploy-local --stop" in proc.stdout
        assert state["api_url"].startswith("http://127.0.0.1:") and f"UI:      {state['ui_url']}" in proc.stdout
        with urllib.request.urlopen(f"{state['ui_url']}/ui-settings", timeout=20) as resp:
            assert json.load(resp)["api_url"] == state["api_url"]  # the UI talks to this server (was :4200)
        env = {**env, "PREFECT_API_URL": state["api_url"], "PREFECT_HOME": str(home / "client_home")}
        yield {"project": base / "project", "env": env, "state": state, "home": home, "started": started, "base": base}


def deployment_run(d, name: str, *params: str, timeout: int = 420) -> subprocess.CompletedProcess:
    cmd = [PREFECT, "deployment", "run", name, "--watch", "--watch-interval", "1"]
    for param in params:
        cmd += ["--param", param]
    return subprocess.run(cmd, env=d["env"], cwd=d["base"], capture_output=True, text=True, timeout=timeout)


def last_run(d, name: str):
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId
    from prefect.client.schemas.sorting import FlowRunSort

    with SyncPrefectClient(d["state"]["api_url"]) as client:
        deployment = client.read_deployment_by_name(name)
        [run] = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment.id])),
            sort=FlowRunSort.START_TIME_DESC,
            limit=1,
        )
    return run


def test_infer_local_then_evaluate_local_on_the_demo(deployed):
    d = deployed
    run = deployment_run(d, "infer/local")
    seconds = time.monotonic() - d["started"]
    assert run.returncode == 0 and "Completed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    print(f"\ndeploy-local -> finished infer/local run (fresh project, demo data generated): {seconds:.1f} s")
    out = d["project"] / "exp/dtmf/inference"
    for test_set, n, errors in (("test_clean", 300, 0), ("test_noisy", 200, 8)):
        hyp = (out / test_set / "hyp.scp").read_text().splitlines()
        ref = (out / test_set / "ref.scp").read_text().splitlines()
        assert len(hyp) == len(ref) == n
        assert sum(h != r for h, r in zip(hyp, ref)) == errors  # test_noisy: its 8 impaired utterances

    run = deployment_run(d, "evaluate/local")
    assert run.returncode == 0 and "Completed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    scores = json.loads((out / "metrics.json").read_text())
    assert list(scores) == [WER_T, CER_T]
    for test_set, words, errors in (("test_clean", 300, 0), ("test_noisy", 200, 8)):
        assert scores[WER_T][test_set] == {"WER": round(100 * errors / words, 2)}
    # An utterance's digits are one word (ESPnet3's WER splits on whitespace): each impaired utterance is one
    # substituted word. Per character, the designed kinds show: weak tone + merged presses 4 deletions,
    # crosstalk 2 substitutions, stray key 2 insertions.
    wer = (out / "test_noisy" / "wer_alignment").read_text().splitlines()[-1]
    assert wer == "WER: 4.00 (hits=192, substitutions=8, deletions=0, insertions=0)"
    cer = (out / "test_noisy" / "cer_alignment").read_text().splitlines()[-1]
    assert cer == "CER: 0.71 (hits=1122, substitutions=2, deletions=4, insertions=2)"
    [record] = [json.loads(x) for x in (out / "evaluate_history.jsonl").read_text().splitlines()]
    planned = sum(
        len(json.loads((out / t / "manifest.json").read_text())["shards"]) for t in ("test_clean", "test_noisy")
    )
    assert planned > 2 and record["shards_run"] == 0 and record["shards_cached"] == planned  # infer/local's, reused
    assert record["model"]["kind"] == "config" and record["headline"]["WER"] == {"test_clean": 0.0, "test_noisy": 4.0}
    assert (out / "evaluate_history.png").read_bytes()[:4] == b"\x89PNG"


def test_metrics_local_on_known_errors(deployed):
    d = deployed
    src = d["project"] / "exp/dtmf/inference/test_clean"
    dst = d["project"] / "exp/errors/inference/test_clean"
    dst.mkdir(parents=True)
    refs = [line.split(" ", 1) for line in (src / "ref.scp").read_text().splitlines()]
    shutil.copy(src / "ref.scp", dst / "ref.scp")
    hyps = [[u, t] for u, t in refs]
    hyps[0][1] = ""  # an empty hyp: its digits are all deletions
    hyps[1][1] = ("1" if hyps[1][1][0] != "1" else "2") + hyps[1][1][1:]  # one digit substituted
    (dst / "hyp.scp").write_text("".join(f"{u} {t}\n" for u, t in hyps))
    run = deployment_run(d, "metrics/local", 'overrides=["inference_dir=exp/errors/inference", "~dataset"]')
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    scores = json.loads((dst.parent / "metrics.json").read_text())
    chars = sum(len(t) for _, t in refs)
    assert scores[WER_T]["test_clean"] == {"WER": round(100 * 2 / 300, 2)} == {"WER": 0.67}
    # ESPnet3 scores the empty hyp as "." : one substitution, like the wrong digit
    assert (dst / "wer_alignment").read_text().endswith("substitutions=2, deletions=0, insertions=0)\n")
    assert scores[CER_T]["test_clean"]["CER"] == round(100 * (len(refs[0][1]) + 1) / chars, 2)


def test_bad_parameters_fail_the_run_at_once_with_the_message(deployed):
    d = deployed
    run = deployment_run(d, "infer/local", 'overrides=["parallel.env=slrum"]', timeout=180)
    assert run.returncode != 0
    failed = last_run(d, "infer/local")
    line = (
        "parallel.env: unknown backend 'slrum'; valid values: local, local_gpu, slurm, pbs, sge, lsf, htcondor, "
        "moab, oar, ssh, kube"
    )
    assert failed.state.is_failed() and failed.state.message == line  # the state says why (inspect, the UI)
    watched = " ".join(run.stdout.split())  # --watch shows the line (the terminal wraps it), no traceback
    assert line in watched and "Traceback" not in run.stdout, run.stdout[-3000:]
    assert failed.total_run_time.total_seconds() < 10  # config checked before any cluster starts
    inspect = subprocess.run(
        [PREFECT, "flow-run", "inspect", str(failed.id)], env=d["env"], capture_output=True, text=True, timeout=120
    )
    assert line in " ".join(inspect.stdout.split()), inspect.stdout[-2000:]
    run = deployment_run(d, "infer/local", 'overrides=["+batch_sise=16"]', timeout=180)  # a misspelt key
    failed = last_run(d, "infer/local")
    assert failed.state.is_failed() and failed.state.message == (
        "batch_sise: not a config key; did you mean batch_size? (a key of your own: list it under allow_keys:)"
    )
    run = deployment_run(d, "evaluate/local", 'metrics_config=["recipes/dtmf/conf/nope.yaml"]', timeout=180)
    failed = last_run(d, "evaluate/local")
    assert failed.state.is_failed() and "config file not found: recipes/dtmf/conf/nope.yaml" in failed.state.message
    run = deployment_run(d, "recipe/local", timeout=180)  # its workdir left at null
    failed = last_run(d, "recipe/local")
    assert failed.state.is_failed()
    assert failed.state.message == "workdir: give the recipe folder (the one holding run.py and conf/)"


def test_infer_detach_returns_at_once_and_the_run_finishes_in_its_folder(deployed):
    from prefect.client.orchestration import SyncPrefectClient

    d = deployed
    elsewhere = d["base"] / "elsewhere"
    elsewhere.mkdir()
    data = d["project"] / "exp/dtmf/data/test_noisy"
    started = time.monotonic()
    proc = subprocess.run(
        [
            *CLI,
            "infer",
            "--detach",
            "--config",
            str(d["project"] / "recipes/dtmf/conf/inference.yaml"),
            "inference_dir=exp/detached",
            f"dataset.test=[{{name: test_noisy, data_dir: {data}}}]",
            "parallel.n_workers=1",
        ],
        env={k: v for k, v in d["env"].items() if k != "PREFECT_API_URL"},
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert time.monotonic() - started < 60
    run_id = proc.stdout.split("flow run id: ")[1].split()[0]
    assert f"{d['state']['ui_url']}/runs/flow-run/{run_id}" in proc.stdout
    with SyncPrefectClient(d["state"]["api_url"]) as client:  # the submitting process is gone by now
        deadline = time.monotonic() + 300
        while not (run := client.read_flow_run(run_id)).state.is_final() and time.monotonic() < deadline:
            time.sleep(1)
    assert run.state.is_completed(), run.state.message
    assert run.parameters["workdir"] == str(elsewhere)
    assert len((elsewhere / "exp/detached/test_noisy/hyp.scp").read_text().splitlines()) == 200


@pytest.mark.postgres
def test_nightly_carries_its_cron_schedule_and_every_deployment_exists(deployed):
    from prefect.client.orchestration import SyncPrefectClient

    with SyncPrefectClient(deployed["state"]["api_url"]) as client:
        nightly = client.read_deployment_by_name("evaluate/nightly")
        names = {f"{client.read_flow(dep.flow_id).name}/{dep.name}" for dep in client.read_deployments()}
    [schedule] = nightly.schedules
    assert schedule.schedule.cron == "0 3 * * *" and schedule.schedule.timezone == "America/New_York"
    assert schedule.active
    assert names == {
        "infer/local",
        "infer/local_gpu",
        "infer/slurm",
        "metrics/local",
        "evaluate/local",
        "evaluate/nightly",
        "evaluate/checkpoint",
        "recipe/local",
        "recipe/slurm",
        "recipe/nightly",
    }
    assert nightly.work_pool_name == "espnet3-local"
    with SyncPrefectClient(deployed["state"]["api_url"]) as client:
        [recipe_nightly] = client.read_deployment_by_name("recipe/nightly").schedules
    assert recipe_nightly.schedule.cron == "0 4 * * *" and not recipe_nightly.active  # set workdir first


@pytest.mark.slurm
def test_infer_slurm_deployment_runs_its_workers_as_slurm_jobs(deployed):
    """`prefect deployment run infer/slurm` end to end on the real single-node SLURM (tests/infra)."""
    missing = pytest.fail if os.environ.get("E3P_REQUIRE_BACKENDS") == "1" else pytest.skip
    if not os.environ.get("E3P_SLURM_PARTITION") or shutil.which("squeue") is None:
        missing('SLURM not configured: run eval "$(tests/infra/up.sh slurm)" first')
    d = deployed
    overrides = json.dumps(
        ["inference_dir=exp/dtmf/inference_slurm", "+parallel.options.interface=lo", "~parallel.options.log_directory"]
    )  # -> the per-run job log folder
    run = deployment_run(d, "infer/slurm", f"overrides={overrides}")
    assert run.returncode == 0 and "Completed" in run.stdout, run.stdout[-3000:] + run.stderr[-2000:]
    out = d["project"] / "exp/dtmf/inference_slurm"
    for test_set, errors in (("test_clean", 0), ("test_noisy", 8)):  # test_noisy: its 8 impaired utterances
        hyp = (out / test_set / "hyp.scp").read_text().splitlines()
        ref = (out / test_set / "ref.scp").read_text().splitlines()
        assert hyp and len(hyp) == len(ref) and sum(h != r for h, r in zip(hyp, ref)) == errors
    job_logs = list(out.glob(".dask-jobs/e3p-*/*"))
    assert job_logs, "no SLURM job logs: the workers did not run as SLURM jobs"
    # no job of this run left in the queue (its log folder is named after it; the other test worker
    # may have a batch run of its own on the same SLURM just now)
    ours = {path.parent.name for path in job_logs}
    queued = subprocess.run(["squeue", "-h", "-o", "%j %T"], capture_output=True, text=True).stdout.splitlines()
    assert not [line for line in queued if line.split()[0] in ours], (ours, queued)
