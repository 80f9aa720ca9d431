"""The infer flow on real batch schedulers and a real sshd (tests/infra), no mocks.

Bring them up first, or these tests skip:

    eval "$(tests/infra/up.sh all)"     # SLURM 22.05, Son of Grid Engine, sshd on 127.0.0.1
    .venv/bin/python -m pytest tests/integration/test_real_backends.py
    tests/infra/down.sh all

Asserted: workers are scheduler jobs (the job id is read inside the shards), merged output is
byte-identical to env local, job names carry the flow run, and no job of the run is left in the
queue after the flow succeeded, failed or was cancelled; a broken job script fails the flow with
the job's stderr; workers retire before their walltime and interrupted shards re-run elsewhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import ROOT, toy_config, write_yaml
from tests.helpers.toy import read_lines

pytestmark = pytest.mark.slow


def _answers(cmd: list[str]) -> bool:
    if shutil.which(cmd[0]) is None:
        return False
    try:
        return subprocess.run(cmd, capture_output=True, timeout=20).returncode == 0
    except subprocess.TimeoutExpired:
        return False


def _need(var: str, check: list[str], what: str, service: str) -> str:
    """The variable tests/infra exported for ``service``; skip (fail under E3P_REQUIRE_BACKENDS=1) without it."""
    missing = pytest.fail if os.environ.get("E3P_REQUIRE_BACKENDS") == "1" else pytest.skip
    value = os.environ.get(var)
    if not value:
        missing(f'{what} not configured (${var} unset): run eval "$(tests/infra/up.sh {service})" first')
    if not _answers(check):
        missing(f"{what} does not answer ({' '.join(check)} failed): run tests/infra/up.sh {service}")
    return value


# Session scope: a missing scheduler skips before the Prefect server or the reference run start.
@pytest.fixture(scope="session")
def slurm():
    return {"env": "slurm", "queue": _need("E3P_SLURM_PARTITION", ["scontrol", "ping"], "SLURM", "slurm")}


@pytest.fixture(scope="session")
def sge():
    return {"env": "sge", "queue": _need("E3P_SGE_QUEUE", ["qstat"], "Grid Engine", "sge")}


@pytest.fixture(scope="session")
def sshd():
    port = _need("E3P_SSH_PORT", ["true"], "the private sshd", "sshd")
    return {
        "port": int(port),
        "key": os.environ["E3P_SSH_KEY"],
        "known_hosts": os.environ["E3P_SSH_KNOWN_HOSTS"],
        "user": os.environ.get("E3P_SSH_USER", "root"),
        "host": os.environ.get("E3P_SSH_HOST", "127.0.0.1"),
    }


@pytest.fixture(
    scope="session", params=[pytest.param("slurm", marks=pytest.mark.slurm), pytest.param("sge", marks=pytest.mark.sge)]
)
def batch_backend(request):
    return request.getfixturevalue(request.param)


def batch_parallel(backend: dict, n_workers: int = 2, num_shards: int | None = None, **options) -> dict:
    """A parallel block for the local scheduler: 1 core per job, loopback interface."""
    return {
        "env": backend["env"],
        "n_workers": n_workers,
        "num_shards": num_shards,
        "options": {
            "queue": backend["queue"],
            "cores": 1,
            "processes": 1,
            "memory": "1GB",
            "interface": "lo",
            "walltime": "00:10:00",
            **options,
        },
    }


def queue_jobs(env: str) -> list[tuple[str, str]]:
    """(job id, job name) of every job the scheduler lists."""
    from espnet3_prefect.execution import backends

    return [(j.job_id, j.name) for j in backends.get(env).queue.jobs()]


def wait_no_jobs(env: str, tag: str, timeout_s: float = 5.0) -> list:
    """Jobs named after run ``tag`` still listed after ``timeout_s`` (cleanup already waited for them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        left = [j for j in queue_jobs(env) if j[1].endswith(f"-{tag}")]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def run_flow(tmp_path, cfg: dict, overrides=(), name="inference.yaml"):
    """Run the infer flow; returns (final state, flow run id)."""
    from espnet3_prefect.flows.infer import infer

    path = write_yaml(tmp_path / name, cfg)
    state = infer(config=[str(path)], overrides=list(overrides), return_state=True)
    return state, str(state.state_details.flow_run_id)


def run_tag(flow_run_id: str) -> str:
    from espnet3_prefect.execution.backends.jobs import run_tag as tag

    return tag(flow_run_id)


def dtmf_outputs(inference_dir: Path) -> dict:
    return {
        f"{t}/{f}": (inference_dir / t / f).read_bytes()
        for t in ("test_clean", "test_noisy")
        for f in ("hyp.scp", "ref.scp")
    }


@pytest.fixture(scope="module")
def dtmf_local(tmp_path_factory, prefect_server):
    """The DTMF demo (scale 0.1) on env local: the reference outputs."""
    from dtmf_demo.recipe import prepare

    root = tmp_path_factory.mktemp("dtmf")
    prepare(root / "data", scale=0.1)
    conf = ROOT / "recipes/dtmf/conf/inference.yaml"
    from espnet3_prefect.flows.infer import infer

    infer(config=[str(conf)], overrides=[f"exp_dir={root}", f"inference_dir={root}/local", "parallel.n_workers=2"])
    return root, conf, dtmf_outputs(root / "local")


def test_demo_on_the_batch_scheduler_matches_local_and_leaves_no_job(batch_backend, prefect_server, dtmf_local):
    root, conf, reference = dtmf_local
    sched, backend = batch_backend, batch_backend["env"]
    extra = write_yaml(root / f"parallel_{backend}.yaml", {"parallel": batch_parallel(sched, num_shards=6)})
    from espnet3_prefect.flows.infer import infer

    state = infer(
        config=[str(conf), str(extra)],
        overrides=[f"exp_dir={root}", f"inference_dir={root}/{backend}"],
        return_state=True,
    )
    summaries = state.result()
    tag = run_tag(state.state_details.flow_run_id)
    assert dtmf_outputs(root / backend) == reference  # byte-identical to env local
    for summary in summaries:
        assert summary["shards_run"] == summary["shards"] and summary["jobs"], summary
        assert all(j.isdigit() for j in summary["jobs"]), summary["jobs"]  # SLURM_JOB_ID / JOB_ID inside the shards
    logs = root / backend / ".dask-jobs" / f"e3p-{tag}"
    log_names = " ".join(p.name for p in logs.iterdir())
    assert all(j in log_names for s in summaries for j in s["jobs"]), (
        log_names,
        summaries,
    )  # the shards ran in our jobs
    assert wait_no_jobs(backend, tag, timeout_s=0) == []


@pytest.mark.slurm
def test_failed_flow_cancels_its_jobs(slurm, prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=10, num_shards=2, bad={7: "no_input"})
    cfg["parallel"] = batch_parallel(slurm, num_shards=2)
    state, flow_run_id = run_flow(tmp_path, cfg)
    assert state.is_failed() and "has no input_key 'x'" in str(state.message)
    assert wait_no_jobs("slurm", run_tag(flow_run_id), timeout_s=0) == []


@pytest.mark.slurm
def test_broken_job_script_fails_fast_with_the_jobs_stderr(slurm, prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=4, num_shards=1)
    cfg["parallel"] = batch_parallel(slurm, job_script_prologue=["echo e3p-prologue-broke >&2", "exit 3"])
    started = time.monotonic()
    state, flow_run_id = run_flow(tmp_path, cfg)
    assert state.is_failed()
    message = str(state.message)
    assert "ended before a Dask worker connected" in message and "e3p-prologue-broke" in message, message
    assert time.monotonic() - started < 60
    assert wait_no_jobs("slurm", run_tag(flow_run_id), timeout_s=0) == []


@pytest.mark.slurm
def test_a_rejected_submission_is_one_line_and_leaves_no_job(slurm, prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=4, num_shards=1)
    cfg["parallel"] = batch_parallel({**slurm, "queue": "no-such-partition"})
    state, flow_run_id = run_flow(tmp_path, cfg)
    assert state.is_failed()
    message = str(state.message)
    assert (
        "parallel.env 'slurm': the scheduler rejected the worker jobs: sbatch: error: invalid partition" in message
    ), message
    assert wait_no_jobs("slurm", run_tag(flow_run_id), timeout_s=0) == []


@pytest.mark.sge
def test_sge_failed_flow_cancels_its_jobs(sge, prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=10, num_shards=2, bad={2: "space_id"})
    cfg["parallel"] = batch_parallel(sge, num_shards=2)
    state, flow_run_id = run_flow(tmp_path, cfg)
    assert state.is_failed() and "utt_id 'utt 2': must be a plain token (no whitespace" in str(state.message)
    assert wait_no_jobs("sge", run_tag(flow_run_id), timeout_s=0) == []


def _job_log(tmp_path) -> dict[int, set[str]]:
    """item index -> batch job ids that computed it (from JobRecordingRunner's log)."""
    seen = defaultdict(set)
    for line in read_lines(tmp_path / "jobs.log"):
        job, _pid, idx = line.split()
        seen[int(idx)].add(job)
    return seen


def _slow_toy(tmp_path, n: int, num_shards: int, delay_s: float, slow_once: bool = False) -> dict:
    cfg = toy_config(tmp_path, n=n, num_shards=num_shards)
    cfg["runner"]["_target_"] = "tests.helpers.toy.JobRecordingRunner"
    cfg["provider"]["params"].update(job_log=str(tmp_path / "jobs.log"), delay_s=delay_s, slow_once=slow_once)
    return cfg


@pytest.mark.slurm
def test_workers_retire_before_the_walltime_and_interrupted_shards_rerun(slurm, prefect_server, tmp_path):
    # walltime 1 min, margin 20 s: each worker retires after 37 +- 3 s and adapt starts a new job;
    # ~80 s of work on 2 workers needs at least two generations of jobs.
    cfg = _slow_toy(tmp_path, n=96, num_shards=24, delay_s=0.8)
    cfg["parallel"] = {**batch_parallel(slurm, num_shards=24, walltime="00:01:00"), "lifetime_margin_s": 20}
    state, flow_run_id = run_flow(tmp_path, cfg)
    assert state.is_completed(), state.message
    [summary] = state.result()
    lines = (tmp_path / "inference/test_a/y.scp").read_text().splitlines()
    assert lines == [f"utt{i:05d} {3 * i * i}" for i in range(96)]  # complete, in order
    seen = _job_log(tmp_path)
    jobs = set().union(*seen.values())
    assert len(jobs) >= 3, jobs  # retired workers were replaced by new jobs
    assert summary["shards"] == 24 and len(summary["jobs"]) >= 3
    assert wait_no_jobs("slurm", run_tag(flow_run_id), timeout_s=0) == []


@pytest.mark.slurm
def test_a_shard_killed_by_the_walltime_reruns_on_a_fresh_job(slurm, prefect_server, tmp_path):
    # The user's own --lifetime (longer than the walltime) wins over ours: SLURM kills the jobs at
    # the walltime (1 min, enforced within 30 s) in the middle of a 96 s shard; the shard runs again
    # on a replacement job, quickly for the items the killed attempt finished.
    cfg = _slow_toy(tmp_path, n=16, num_shards=2, delay_s=12, slow_once=True)
    cfg["parallel"] = batch_parallel(
        slurm, n_workers=2, num_shards=2, walltime="00:01:00", worker_extra_args=["--lifetime", "10m"]
    )
    state, flow_run_id = run_flow(tmp_path, cfg)
    assert state.is_completed(), state.message
    lines = (tmp_path / "inference/test_a/y.scp").read_text().splitlines()
    assert lines == [f"utt{i:05d} {3 * i * i}" for i in range(16)]
    seen = _job_log(tmp_path)
    assert any(len(jobs) > 1 for jobs in seen.values()), seen  # items computed again in another job
    assert wait_no_jobs("slurm", run_tag(flow_run_id), timeout_s=0) == []


def _task_run_history(flow_run_id: str, name: str, timeout_s: float = 30.0) -> list[str]:
    """The state types the server recorded for the flow run's task run ``name``, oldest first, once it
    has recorded a final one (workers send states as events, recorded a little later)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while True:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            found = [t for t in runs if t.name == name]
            history = [s.type.value for s in client.read_task_run_states(found[0].id)] if found else []
            if (history and history[-1] == "COMPLETED") or time.monotonic() > deadline:
                return history
            time.sleep(0.5)


@pytest.mark.slurm
def test_a_worker_job_preempted_mid_shard_costs_only_that_shard(slurm, prefect_server, tmp_path):
    # As SLURM preempts a job: SIGTERM to every process of the job (--full: the batch step, where the
    # Dask worker runs, too), then SIGKILL after a grace time. 6 shards of 4 items, 1.5 s each.
    import threading

    cfg = _slow_toy(tmp_path, n=24, num_shards=6, delay_s=1.5)
    cfg["parallel"] = batch_parallel(slurm, n_workers=2, num_shards=6)
    log = tmp_path / "jobs.log"
    preempted: dict = {}

    def preempt() -> None:  # beside the flow, which runs in the main thread (it sets signal handlers)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            for line in read_lines(log):
                job, _pid, idx = line.split()
                if int(idx) % 4 == 0:  # the first item of a shard is done, three to go: mid-shard
                    done_before = {int(x.split()[2]) for x in read_lines(log)}
                    preempted.update(job=job, lost=int(idx) // 4, done_before=done_before)
                    subprocess.run(["scancel", "--full", "--signal=TERM", job], check=True, timeout=30)
                    time.sleep(3)  # the scheduler's grace time
                    # the job may have ended on the TERM already: scancel then says "invalid job id", exit 1
                    for last in (["--full", "--signal=KILL", job], [job]):
                        subprocess.run(["scancel", *last], check=False, timeout=30, capture_output=True)
                    return
            time.sleep(0.1)

    watcher = threading.Thread(target=preempt, daemon=True)
    watcher.start()
    state, flow_run_id = run_flow(tmp_path, cfg)
    watcher.join(60)
    assert preempted, "no shard started within 240 s"
    lost, done_before = preempted["lost"], preempted["done_before"]
    assert state.is_completed(), state.message
    text = (tmp_path / "inference/test_a/y.scp").read_text()
    assert text == "".join(f"utt{i:05d} {3 * i * i}\n" for i in range(24))  # what an undisturbed run writes
    seen = _job_log(tmp_path)
    again = {i for i, jobs in seen.items() if len(jobs) > 1}
    assert again <= set(range(4 * lost, 4 * lost + 4)), (lost, again, dict(seen))  # only the lost shard
    assert all(len(jobs) == 1 for i, jobs in seen.items() if i in done_before and i // 4 != lost)
    history = _task_run_history(flow_run_id, f"run-shard-test_a-{lost}")
    assert "CRASHED" in history and history[-1] == "COMPLETED", history
    others = [_task_run_history(flow_run_id, f"run-shard-test_a-{k}") for k in range(6) if k != lost]
    assert all("CRASHED" not in h and h[-1] == "COMPLETED" for h in others), others
    assert wait_no_jobs("slurm", run_tag(flow_run_id), timeout_s=0) == []


@pytest.mark.slurm
def test_cancelling_a_deployment_run_cancels_its_jobs(slurm, prefect_server, tmp_path):
    """A real cancellation: the flow is served by a Prefect runner, cancelled through the API."""
    from prefect import get_client
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelling

    cfg = _slow_toy(tmp_path, n=40, num_shards=4, delay_s=2)
    cfg["parallel"] = batch_parallel(slurm, num_shards=4)
    path = write_yaml(tmp_path / "inference.yaml", cfg)
    name = f"cancel-{tmp_path.name}"
    serve = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from espnet3_prefect.flows.infer import infer; "
            "infer.serve(name=sys.argv[1], print_starting_message=False)",
            name,
        ],
        cwd=ROOT,
        env={**os.environ},
        stdout=open(tmp_path / "serve.log", "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        flow_run, tag = start_served_run(name, path, serve, tmp_path, serve_timeout_s=60)
        ours = [j for j in queue_jobs("slurm") if j[1] == f"e3p-{tag}"]
        assert len(ours) == 2, (ours, queue_jobs("slurm"))  # the job names carry the flow run
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run.id, Cancelling(), force=True)
            deadline = time.monotonic() + 90
            while True:
                state = client.read_flow_run(flow_run.id).state
                if state.type == StateType.CANCELLED and not wait_no_jobs("slurm", tag, timeout_s=0):
                    break
                assert time.monotonic() < deadline, (state, queue_jobs("slurm"))
                time.sleep(0.5)
        assert not (tmp_path / "inference/test_a/y.scp").exists()
    finally:
        os.killpg(serve.pid, 15)
        serve.wait(timeout=30)
    assert wait_no_jobs("slurm", tag, timeout_s=0) == []


@pytest.mark.ssh
def test_ssh_cluster_over_the_private_sshd_matches_local(sshd, prefect_server, tmp_path):
    ref_cfg = toy_config(tmp_path / "local", n=23, num_shards=5)
    run_flow(tmp_path / "local", ref_cfg)
    cfg = toy_config(tmp_path / "ssh", n=23, num_shards=5)
    cfg["runner"]["_target_"] = "tests.helpers.toy.JobRecordingRunner"
    cfg["provider"]["params"]["job_log"] = str(tmp_path / "ssh_pids.log")
    connect = {
        "port": sshd["port"],
        "username": sshd["user"],
        "client_keys": [sshd["key"]],
        "known_hosts": sshd["known_hosts"],
    }  # host key checked against the sshd's key
    cfg["parallel"] = {
        "env": "ssh",
        "n_workers": 2,
        "num_shards": 5,
        "options": {"hosts": [sshd["host"], sshd["host"]], "connect_options": connect},
    }
    state, _ = run_flow(tmp_path / "ssh", cfg)
    assert state.is_completed(), state.message
    for name in ("y.scp", "ref.scp"):
        assert (tmp_path / f"ssh/inference/test_a/{name}").read_bytes() == (
            tmp_path / f"local/inference/test_a/{name}"
        ).read_bytes()
    pids = {line.split()[1] for line in read_lines(tmp_path / "ssh_pids.log")}
    assert pids and str(os.getpid()) not in pids


@pytest.mark.ssh
def test_ssh_unknown_host_key_is_a_one_line_error(sshd, prefect_server, tmp_path):
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    cfg = toy_config(tmp_path, n=4, num_shards=1)
    cfg["parallel"] = {
        "env": "ssh",
        "n_workers": 1,
        "options": {
            "hosts": [sshd["host"], sshd["host"]],
            "connect_options": {
                "port": sshd["port"],
                "username": sshd["user"],
                "client_keys": [sshd["key"]],
                "known_hosts": str(empty),
            },
        },
    }
    state, _ = run_flow(tmp_path, cfg)
    assert state.is_failed()
    assert "Host key is not trusted" in str(state.message)
    assert "parallel.options.connect_options.known_hosts" in str(state.message)


def start_served_run(name: str, config_path, serve: subprocess.Popen, work_dir, serve_timeout_s: float):
    """Run the deployment ``infer/<name>`` that ``serve`` is serving (retried until it answers, at most
    ``serve_timeout_s``), then wait until its shards run inside our jobs (``work_dir/jobs.log``).
    Returns ``(flow run, run tag)``; ``work_dir/serve.log`` is shown when the shards never start."""
    from prefect.deployments import run_deployment

    flow_run = None
    deadline = time.monotonic() + serve_timeout_s
    while flow_run is None:
        try:
            flow_run = run_deployment(f"infer/{name}", parameters={"config": [str(config_path)]}, timeout=0)
        except Exception:
            if time.monotonic() > deadline or serve.poll() is not None:
                raise
            time.sleep(1)
    deadline = time.monotonic() + 120
    while not (work_dir / "jobs.log").exists():  # shards are running inside our jobs
        assert time.monotonic() < deadline, (work_dir / "serve.log").read_text()[-3000:]
        time.sleep(0.5)
    return flow_run, run_tag(str(flow_run.id))


def _worker_environ() -> dict:
    return {k: os.environ.get(k) for k in ("MALLOC_TRIM_THRESHOLD_", "OMP_NUM_THREADS", "SLURM_JOB_ID", "JOB_ID")}


def test_batch_workers_keep_glibc_allocator_thresholds(batch_backend, tmp_path, monkeypatch):
    """A job's nanny does not export Dask's MALLOC_TRIM_THRESHOLD_ to its worker (the job script says
    so to Dask), and still sets Dask's other pre-spawn variables."""
    import logging

    # A job inherits the driver's environment, and a nanny started earlier in this test process with
    # Dask's defaults (a stock LocalCluster in another test) left the variable there: a user who sets
    # it keeps it (allocator.py). Here the driver's environment is a user's who did not.
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)

    from espnet3_prefect.execution.cluster import open_task_runner
    from espnet3_prefect.execution.spec import ParallelSpec

    spec = ParallelSpec.from_config(batch_parallel(batch_backend, n_workers=1))
    with open_task_runner(spec, log_root=tmp_path, logger=logging.getLogger("test")) as runner:
        runner.client.wait_for_workers(1, timeout=120)
        [environ] = runner.client.run(_worker_environ).values()
    assert environ["SLURM_JOB_ID"] or environ["JOB_ID"], environ  # the worker is a batch job
    assert environ["MALLOC_TRIM_THRESHOLD_"] is None and environ["OMP_NUM_THREADS"] == "1", environ
