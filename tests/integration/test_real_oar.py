"""The infer flow on the real OAR 2.5.9 of tests/infra (oar_up.sh), no mocks.

Bring it up first, or these tests skip:

    eval "$(tests/infra/up.sh oar)"
    .venv/bin/python -m pytest -m oar tests/integration/test_real_oar.py
    tests/infra/down.sh oar

OAR's admission rules refuse jobs from root, so these tests run the flow the way a user would:
the ``espnet3-prefect`` command (or a Prefect runner serving the flow) as the submit user that
tests/infra created (``$E3P_OAR_USER``, started with runuser), with a Python that user can read,
against this session's Prefect server. oar_up.sh lets that user reach this checkout.

Asserted: the demo is byte-identical to env local, the job logs are in
``<inference_dir>/.dask-jobs/<job name>``, OAR's records tie the jobs to the run and the shards ran
in them, ``cluster-script`` shows the options OAR recorded, no job of the run is left after
success, failure or cancellation, and a rejected submission fails at once with OAR's words.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, toy_config, write_yaml
from tests.helpers.toy import read_lines
from tests.integration.test_real_backends import (  # noqa: F401 (dtmf_local is a fixture)
    _need,
    _slow_toy,
    batch_parallel,
    dtmf_local,
    dtmf_outputs,
    run_tag,
    start_served_run,
)

pytestmark = pytest.mark.slow

RUNUSER = shutil.which("runuser") or "/usr/sbin/runuser"  # util-linux; /usr/sbin is not on every PATH


@pytest.fixture(scope="session")
def oar():
    user = _need("E3P_OAR_USER", ["oarstat", "-J"], "OAR", "oar")
    state = Path(os.environ.get("E3P_INFRA_DIR") or "/tmp/e3p-infra") / "oar"
    return {
        "env": "oar",
        "queue": os.environ.get("E3P_OAR_QUEUE", "default"),
        "user": user,
        "state": state,
        "memory_property": os.environ.get("E3P_OAR_MEMCORE_PROPERTY", "memcore"),
    }


def _as_user(user: str, cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([RUNUSER, "-u", user, "--", *cmd], capture_output=True, text=True, **kwargs)


@pytest.fixture(scope="session")
def oar_python(oar):
    """A Python the submit user can run that imports this project and its dependencies.

    This venv's own Python usually is not one: made from a pyenv under /root (mode 0700), the
    user gets "Permission denied". Then: a venv from /usr/bin/python3 (same minor version) in the
    world-readable infra folder, whose one .pth file adds this venv's site-packages. No pip, nothing
    copied: about 0.1 s. It needs the checkout and its .venv readable by the user (oar_up.sh grants
    it traverse on the folders on the way to the checkout, e.g. a CI clone under /root).
    """
    import espnet3_prefect

    missing = pytest.fail if os.environ.get("E3P_REQUIRE_BACKENDS") == "1" else pytest.skip
    probe = ["-c", "import dask_jobqueue, prefect, torch, espnet3_prefect; print(espnet3_prefect.__file__)"]

    def runs(python: str) -> tuple[bool, str]:
        done = _as_user(oar["user"], [python, *probe], cwd="/", timeout=180)
        return done.returncode == 0 and done.stdout.strip() == espnet3_prefect.__file__, (
            done.stderr.strip().splitlines() or ["?"]
        )[-1]

    ok, why = runs(sys.executable)
    if ok:
        return sys.executable
    base = "/usr/bin/python3"
    try:
        version = subprocess.run(
            [base, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except OSError:
        version = ""
    if version != str(tuple(sys.version_info[:2])):
        missing(
            f"user {oar['user']} cannot run {sys.executable} ({why}) and {base} is not Python "
            f"{sys.version_info[0]}.{sys.version_info[1]}: make a venv readable by that user"
        )
    paths = sysconfig.get_paths()
    key = hashlib.sha1(f"{sys.prefix}|{base}".encode()).hexdigest()[:10]
    venv = oar["state"] / f"python-{key}"
    python = str(venv / "bin" / "python")
    if not (venv.is_dir() and runs(python)[0]):
        building = Path(tempfile.mkdtemp(prefix=".python-", dir=oar["state"]))
        subprocess.run([base, "-m", "venv", "--without-pip", str(building)], check=True, timeout=120)
        site = subprocess.run(
            [str(building / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        adds = "; ".join(f"site.addsitedir({p!r})" for p in dict.fromkeys([paths["purelib"], paths["platlib"]]))
        Path(site, "e3p-project-venv.pth").write_text(f"import site; {adds}\n")
        building.chmod(0o755)
        shutil.rmtree(venv, ignore_errors=True)
        building.rename(venv)
        ok, why = runs(python)
        if not ok:
            missing(
                f"user {oar['user']} cannot import this project with {python} ({why}): "
                f"the checkout {ROOT} and {sys.prefix} must be readable by that user (oar_up.sh "
                f"lets it reach the checkout; a venv elsewhere: E3P_OAR_READ_PATHS={sys.prefix})"
            )
    return python


@pytest.fixture
def oar_work(oar, request):
    """A folder of the submit user's: configs, data, outputs, the flow's cwd."""
    prefix = re.sub(r"[^A-Za-z0-9_.-]", "_", request.node.name)[:60] + "-"
    path = Path(tempfile.mkdtemp(prefix=prefix, dir=oar["state"] / "jobs"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _give(path: Path, user: str) -> None:
    for folder, _dirs, files in os.walk(path):
        shutil.chown(folder, user)
        for name in files:
            shutil.chown(os.path.join(folder, name), user)


def oar_env(work: Path) -> dict[str, str]:
    """What the submit user's process gets: no PWD (oarsub reads the job's folder from it, and a
    driver must not depend on one; without the fix the real OAR refused every job), no root env."""
    (work / ".tmp").mkdir(exist_ok=True)  # TMPDIR: a Prefect runner's /tmp/runner_storage may be root's
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONPATH": str(ROOT),
        "TMPDIR": str(work / ".tmp"),
        "PREFECT_API_URL": os.environ["PREFECT_API_URL"],
        "PREFECT_HOME": str(work / ".prefect"),
    }


def oar_cli(oar: dict, python: str, work: Path, *args: str, timeout_s: float = 300) -> tuple[int, str]:
    """``espnet3-prefect <args>`` as the submit user in ``work``: (exit code, stdout + stderr)."""
    env = oar_env(work)
    _give(work, oar["user"])
    done = subprocess.run(
        [RUNUSER, "-u", oar["user"], "--", python, "-m", "espnet3_prefect.cli", *args],
        cwd=work,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout_s,
    )
    return done.returncode, done.stdout


def flow_run_id_in(output: str) -> str:
    found = re.search(r"/runs/flow-run/([0-9a-f-]{36})", output)
    assert found, output[-3000:]
    return found.group(1)


def oar_parallel(oar: dict, n_workers: int = 2, num_shards: int | None = None, **options) -> dict:
    return batch_parallel(
        oar, n_workers, num_shards, **{"memory_per_core_property_name": oar["memory_property"], **options}
    )


def oar_jobs(*args: str) -> dict[str, dict]:
    """``oarstat -J [args]`` (as root: every user's jobs): job id -> OAR's record."""
    out = subprocess.run(["oarstat", "-J", *args], capture_output=True, text=True, timeout=30, check=True).stdout
    return json.loads(out) if out.strip() else {}


def oar_listed(tag: str) -> list[tuple[str, str]]:
    """(job id, state) of the jobs of run ``tag`` that oarstat still lists."""
    return [(i, j["state"]) for i, j in oar_jobs().items() if (j.get("name") or "").endswith(f"-{tag}")]


def shard_job_ids(inference_dir: Path) -> set[str]:
    """OAR_JOB_ID as each shard saw it (from the shards' done markers, which record their batch job)."""
    markers = [json.loads(p.read_text()) for p in inference_dir.glob("**/split.*/done")]
    assert markers
    return {str(m.get("job_id")) for m in markers}


@pytest.mark.oar
def test_oar_demo_matches_local_with_logs_names_and_no_job_left(oar, oar_python, prefect_server, dtmf_local, oar_work):
    from espnet3_prefect.cli.cluster_script import cluster_preview
    from espnet3_prefect.config.load import load_config

    root, conf, reference = dtmf_local
    shutil.copytree(root / "data", oar_work / "data")
    extra = write_yaml(oar_work / "parallel_oar.yaml", {"parallel": oar_parallel(oar, num_shards=6)})
    overrides = [f"exp_dir={oar_work}", f"inference_dir={oar_work}/oar"]
    rc, out = oar_cli(oar, oar_python, oar_work, "infer", "--config", str(conf), str(extra), *overrides)
    assert rc == 0, out[-3000:]
    flow_run_id = flow_run_id_in(out)
    tag = run_tag(flow_run_id)
    assert dtmf_outputs(oar_work / "oar") == reference  # byte-identical to env local
    assert oar_listed(tag) == []  # nothing left in oarstat when the command returned

    # The jobs' logs are in <inference_dir>/.dask-jobs/<job name>, none in the submitting folder.
    logs = oar_work / "oar" / ".dask-jobs" / f"e3p-{tag}"
    names = sorted(p.name for p in logs.iterdir())
    matches = [re.fullmatch(rf"e3p-{tag}\.(\d+)\.(out|err)", n) for n in names]
    assert names and all(matches), names
    job_ids = {m.group(1) for m in matches}
    assert len(job_ids) >= 2 and not list(oar_work.glob("OAR.*"))
    records = oar_jobs("-f", *[a for i in sorted(job_ids) for a in ("-j", i)])
    for job_id in job_ids:
        job = records[job_id]
        assert job["name"] == f"e3p-{tag}" and job["owner"] == oar["user"], job  # OAR ties the job to the run
        assert job["stderr_file"] == str(logs / f"e3p-{tag}.{job_id}.err")
        assert "Start worker at" in (logs / f"e3p-{tag}.{job_id}.err").read_text()
    assert shard_job_ids(oar_work / "oar") <= job_ids  # every shard ran inside one of them (OAR_JOB_ID)

    # cluster-script shows what was submitted: OAR recorded the same oarsub options.
    _kind, text = cluster_preview(load_config([str(conf), str(extra)], overrides))
    argv = shlex.split(text.replace(" \\\n  ", " "))
    options = " ".join(argv[:-1]).replace("e3p-preview", f"e3p-{tag}")
    request = records[min(job_ids, key=int)]["initial_request"]
    assert request.startswith(options + " "), (options, request)
    assert "-p memcore>=954 " in request
    # TLS by default: OAR recorded the certificate paths, never the key itself (its folder is gone now)
    assert "--protocol tls://" in request and f"tls-e3p-{tag}/key.pem" in request and "PRIVATE KEY" not in request
    assert not (logs / f"tls-e3p-{tag}").exists()


@pytest.mark.oar
def test_oar_failed_flow_cancels_its_jobs(oar, oar_python, prefect_server, oar_work):
    cfg = toy_config(oar_work, n=10, num_shards=2, bad={7: "no_input"})
    cfg["parallel"] = oar_parallel(oar, num_shards=2)
    path = write_yaml(oar_work / "inference.yaml", cfg)
    rc, out = oar_cli(oar, oar_python, oar_work, "infer", "--config", str(path))
    assert rc == 1 and "has no input_key 'x'" in out, out[-3000:]
    tag = run_tag(flow_run_id_in(out))
    assert list((oar_work / "inference" / ".dask-jobs" / f"e3p-{tag}").glob(f"e3p-{tag}.*.err"))  # jobs ran
    assert oar_listed(tag) == []


@pytest.mark.oar
@pytest.mark.parametrize(
    "options, words",
    [
        ({"memory": "4TB"}, "There are not enough resources for your request"),
        (
            {"memory_per_core_property_name": "mem_core"},
            'Bad resource request (ERROR: column "mem_core" does not exist',
        ),
    ],
    ids=["too-much-memory", "unknown-property"],
)
def test_oar_rejected_submission_fails_at_once_with_oars_words(
    oar, oar_python, prefect_server, oar_work, options, words
):
    cfg = toy_config(oar_work, n=4, num_shards=1)
    cfg["parallel"] = oar_parallel(oar, **options)
    path = write_yaml(oar_work / "inference.yaml", cfg)
    started = time.monotonic()
    rc, out = oar_cli(oar, oar_python, oar_work, "infer", "--config", str(path))
    assert rc == 1, out[-3000:]
    assert f"error: parallel.env 'oar': the scheduler rejected the worker jobs: {words}" in out, out[-3000:]
    assert time.monotonic() - started < 60
    assert oar_listed(run_tag(flow_run_id_in(out))) == []


@pytest.mark.oar
def test_oar_cancelling_a_deployment_run_cancels_its_jobs(oar, oar_python, prefect_server, oar_work):
    """The flow served by a Prefect runner of the submit user's, cancelled through the API."""
    from prefect import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelling

    cfg = _slow_toy(oar_work, n=40, num_shards=4, delay_s=2)
    cfg["parallel"] = oar_parallel(oar, num_shards=4)
    path = write_yaml(oar_work / "inference.yaml", cfg)
    env = oar_env(oar_work)
    _give(oar_work, oar["user"])
    name = f"cancel-{oar_work.name}"
    serve = subprocess.Popen(
        [
            RUNUSER,
            "-u",
            oar["user"],
            "--",
            oar_python,
            "-c",
            "import sys; from espnet3_prefect.flows.infer import infer; "
            "infer.serve(name=sys.argv[1], print_starting_message=False)",
            name,
        ],
        cwd=oar_work,
        env=env,
        stdout=open(oar_work / "serve.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    tag = None
    try:
        flow_run, tag = start_served_run(name, path, serve, oar_work, serve_timeout_s=90)
        running = oar_listed(tag)
        assert len(running) == 2, (running, oar_jobs())  # the job names carry the flow run
        assert {line.split()[0] for line in read_lines(oar_work / "jobs.log")} <= {i for i, _ in running}
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run.id, Cancelling(), force=True)
            deadline = time.monotonic() + 90
            while True:
                state = client.read_flow_run(flow_run.id).state
                if state.type == StateType.CANCELLED and not oar_listed(tag):
                    break
                assert time.monotonic() < deadline, (state, oar_listed(tag))
                time.sleep(0.5)
        assert not (oar_work / "inference/test_a/y.scp").exists()
    finally:
        os.killpg(serve.pid, 15)
        serve.wait(timeout=30)
    assert oar_listed(tag) == []
