"""Batch-scheduler and SSH options: our defaults, the user's options winning, walltime-aware
lifetimes, one-line errors for misconfiguration, job names/logs, and the cluster-script command."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution import backends
from espnet3_prefect.execution.backends import cluster_kwargs
from espnet3_prefect.execution.backends.jobs import QueuedJob, _ours, job_log_files, run_job_name, run_tag, tail
from espnet3_prefect.execution.backends.walltime import default_margin_s, worker_lifetime
from espnet3_prefect.execution.cluster import cancel_jobs_hook
from espnet3_prefect.execution.spec import ParallelSpec, build_task_runner
from tests.conftest import ROOT, write_yaml

BASE = {"cores": 1, "memory": "1GB"}


def walltime_seconds(env, text):
    return backends.get(env).walltime_seconds(text)


def adapt_kwargs(spec):
    return backends.get(spec.env).adapt_kwargs(spec)


def spec(env="slurm", n_workers=2, margin=None, **options):
    block = {"env": env, "n_workers": n_workers, "options": {**BASE, **options}}
    if margin is not None:
        block["lifetime_margin_s"] = margin
    return ParallelSpec.from_config(block)


@pytest.mark.parametrize(
    "env, text, seconds",
    [
        ("slurm", "30", 1800),
        ("slurm", "10:30", 630),
        ("slurm", "04:00:00", 14400),
        ("slurm", "2-00", 172800),
        ("slurm", "1-12:30", 131400),
        ("pbs", "04:00:00", 14400),
        ("pbs", "90", 90),
        ("sge", "02:00:00", 7200),
        ("sge", "3600", 3600),
        ("lsf", "02:30", 9000),
        ("lsf", "45", 2700),
        ("moab", "08:00:00", 28800),
        ("oar", "2", 7200),
        ("oar", "1:30", 5400),
    ],
)
def test_walltime_is_read_the_way_each_scheduler_reads_it(env, text, seconds):
    assert walltime_seconds(env, text) == seconds


@pytest.mark.parametrize(
    "env, value, message",
    [
        ("slurm", 3600, "must be a string like .*YAML reads an unquoted 1:00:00 as a number: quote it"),
        ("lsf", "01:00:00", "cannot read '01:00:00' as a walltime for env 'lsf' \\(expected HH:MM\\)"),
        ("sge", "10:00", "cannot read '10:00' as a walltime for env 'sge'"),
        ("pbs", "four hours", "cannot read 'four hours'"),
        ("slurm", "00:00:00", "must be longer than zero"),
    ],
)
def test_bad_walltimes_are_one_line_errors_naming_the_key(env, value, message):
    with pytest.raises(ConfigError, match=f"^parallel.options.walltime: {message}") as err:
        spec(env, walltime=value)
    assert "\n" not in str(err.value)


def test_lifetime_is_a_margin_before_the_walltime_and_workers_are_replaced():
    assert [default_margin_s(w) for w in (60, 600, 3600, 36000)] == [15, 60, 180, 600]
    lifetime = worker_lifetime(3600)
    assert lifetime.seconds + lifetime.stagger_s == 3600 - lifetime.margin_s  # latest retirement: walltime - margin
    s = spec(walltime="01:00:00")
    kwargs = cluster_kwargs(s)
    assert kwargs["worker_extra_args"][-4:] == ["--lifetime", "3240s", "--lifetime-stagger", "180s"]
    assert adapt_kwargs(s) == {"minimum": 2, "maximum": 2}
    assert build_task_runner(s).adapt_kwargs == {"minimum": 2, "maximum": 2}
    # the margin is overridable; the jobqueue default walltime (30 min) applies when none is set
    assert "--lifetime 1500s" in " ".join(cluster_kwargs(spec(margin=210, walltime="00:30:00"))["worker_extra_args"])
    assert "--lifetime" in cluster_kwargs(spec())["worker_extra_args"]
    # HTCondor jobs have no walltime in dask-jobqueue: no lifetime, no adapt
    condor = spec("htcondor", disk="1GB")
    assert "--lifetime" not in cluster_kwargs(condor)["worker_extra_args"] and adapt_kwargs(condor) is None


def test_lifetime_margin_errors():
    with pytest.raises(
        ConfigError, match="^parallel.lifetime_margin_s: 50.0 s leaves workers no lifetime within a walltime of 60 s"
    ):
        spec(margin=50, walltime="00:01:00")
    with pytest.raises(ConfigError, match="^parallel.lifetime_margin_s: only for envs with a walltime .*not 'local'"):
        ParallelSpec.from_config({"env": "local", "lifetime_margin_s": 60})
    with pytest.raises(ConfigError, match="^parallel.lifetime_margin_s: must be a number of seconds >= 0, got 'soon'"):
        spec(margin="soon")


def test_jobqueue_defaults_and_the_users_options_win(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    monkeypatch.setenv("PYTHONPATH", "/my recipe")
    kwargs = cluster_kwargs(spec(queue="debug"), job_name="e3p-abc", log_directory="/logs/e3p-abc")
    assert kwargs["log_directory"] == "/logs/e3p-abc" and kwargs["job_name"] == "e3p-abc"
    assert kwargs["scheduler_options"] == {"dashboard_address": "127.0.0.1:0"}
    assert kwargs["worker_extra_args"][:2] == ["--dashboard-address", "127.0.0.1:0"]
    assert kwargs["job_script_prologue"] == [
        "export DASK_DISTRIBUTED__NANNY__PRE_SPAWN_ENVIRON='{\"MALLOC_TRIM_THRESHOLD_\": None}'",
        "export PREFECT_API_URL=http://127.0.0.1:4200/api",
        "export PYTHONPATH='/my recipe'",
    ]
    assert "interface" not in kwargs  # multi-node clusters keep dask-jobqueue's own choice
    mine = cluster_kwargs(
        spec(
            log_directory="/mine",
            scheduler_options={"dashboard_address": ":9999", "port": 0},
            worker_extra_args=["--no-dashboard", "--lifetime", "1h"],
            job_name="asr",
            job_script_prologue=["module load cuda"],
        ),
        job_name="asr-abc",
        log_directory="/logs/e3p-abc",
    )
    assert mine["log_directory"] == "/mine" and mine["job_name"] == "asr-abc"
    assert mine["scheduler_options"] == {"dashboard_address": ":9999", "port": 0}
    assert mine["worker_extra_args"] == ["--no-dashboard", "--lifetime", "1h"]
    assert mine["job_script_prologue"][-1] == "module load cuda"


@pytest.mark.parametrize(
    "env, options, message",
    [
        (
            "slurm",
            {"job_extra_directives": "--gres=gpu:1"},
            "parallel.options.job_extra_directives: must be a list of strings, got str '--gres=gpu:1' "
            "\\(write it as \\['--gres=gpu:1'\\]\\)",
        ),
        (
            "pbs",
            {"job_script_prologue": {"module": "cuda"}},
            "parallel.options.job_script_prologue: must be a list of strings, got dict",
        ),
        ("sge", {"cores": None}, "parallel.options.cores: required for env 'sge' \\(cores and memory per job"),
        ("lsf", {"memory": "lots"}, "parallel.options.memory: cannot read 'lots' as an amount of memory"),
        ("slurm", {"cores": 0}, "parallel.options.cores: must be a positive integer, got 0"),
        (
            "moab",
            {"processes": 4},
            "parallel.options.processes: 4 worker processes per job need at least as many cores, got cores: 1",
        ),
        ("htcondor", {}, "parallel.options.disk: required for env 'htcondor'"),
        (
            "htcondor",
            {"disk": "1GB", "walltime": "01:00:00"},
            "parallel.options.walltime: not an option of env 'htcondor'",
        ),
        ("oar", {"gres": "gpu:1"}, "parallel.options.gres: not an option of env 'oar'"),
        ("kube", {}, "parallel.options.image: required for env 'kube'"),
        ("kube", {"image": "x", "env": ["A=1"]}, "parallel.options.env: must be a mapping, got list"),
    ],
)
def test_misconfigured_backends_fail_on_one_line(env, options, message):
    opts = {**BASE, **options} if env != "kube" else options
    opts = {k: v for k, v in opts.items() if v is not None}
    with pytest.raises(ConfigError, match=f"^{message}") as err:
        ParallelSpec.from_config({"env": env, "options": opts})
    assert "\n" not in str(err.value)


def test_ssh_defaults_loopback_hosts_env_on_the_command_line(monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:4200/api")
    monkeypatch.delenv("PYTHONPATH", raising=False)
    s = ParallelSpec.from_config(
        {
            "env": "ssh",
            "n_workers": 3,
            "options": {"hosts": ["127.0.0.1", "localhost"], "connect_options": {"known_hosts": "/kh", "port": 2222}},
        }
    )
    kwargs = cluster_kwargs(s)
    assert kwargs["hosts"] == ["127.0.0.1", "localhost", "localhost", "localhost"]
    assert kwargs["scheduler_options"] == {"host": "127.0.0.1", "port": 0, "dashboard_address": "127.0.0.1:0"}
    assert kwargs["worker_options"]["host"] == "127.0.0.1"
    assert kwargs["connect_options"] == {"known_hosts": "/kh", "port": 2222}  # host-key policy is the user's
    assert kwargs["remote_python"] == f"PREFECT_API_URL=http://127.0.0.1:4200/api {sys.executable}"
    remote = cluster_kwargs(
        ParallelSpec.from_config(
            {
                "env": "ssh",
                "options": {
                    "hosts": ["node1", "node2"],
                    "worker_options": {"nthreads": 4},
                    "remote_python": "/opt/py/bin/python",
                },
            }
        )
    )
    assert remote["scheduler_options"]["host"] == "node1" and "host" not in remote["worker_options"]
    assert remote["worker_options"]["nthreads"] == 4 and remote["remote_python"].endswith(" /opt/py/bin/python")
    with pytest.raises(ConfigError, match="^parallel.options.connect_options: must be a mapping"):
        cluster_kwargs(
            ParallelSpec.from_config({"env": "ssh", "options": {"hosts": ["a", "b"], "connect_options": "x"}})
        )


def test_job_names_carry_the_flow_run_and_match_only_that_run():
    run_id = "0190b0c6-1c2d-7e3f-8a4b-5c6d7e8f9a0b"
    assert run_job_name(None, run_id) == "e3p-6d7e8f9a0b" and run_job_name("asr", run_id) == "asr-6d7e8f9a0b"
    assert len(run_tag()) == 10 and run_tag() != run_tag()  # outside a flow run: random
    tag = run_tag(run_id)
    assert _ours(QueuedJob("7", "asr-6d7e8f9a0b", "RUNNING"), tag)
    assert not _ours(QueuedJob("8", "e3p-6d7e8f9a0c", "RUNNING"), tag)


def test_job_log_files_are_found_by_job_id(tmp_path):
    for name in ("e3p-abc-12.err", "e3p-abc-12.out", "e3p-abc-123.err", "e3p-abc.o12", "other-12.err"):
        (tmp_path / name).write_text("line1\nline2\n")
    old = time.time() - 3600
    import os

    os.utime(tmp_path / "other-12.err", (old, old))  # an earlier run's job 12 in a shared folder
    found = [p.name for p in job_log_files(tmp_path, "12", "e3p-abc", since=time.time() - 60)]
    assert found == ["e3p-abc-12.err", "e3p-abc-12.out", "e3p-abc.o12"]
    assert tail(tmp_path / "e3p-abc-12.err", lines=1) == "line2"


def test_cancel_hook_is_quiet_without_any_scheduler(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")

    class Run:
        id = "0190b0c6-1c2d-7e3f-8a4b-5c6d7e8f9a0b"

    cancel_jobs_hook(None, Run(), None)  # neither squeue nor qstat: nothing to do, no error


CLI = [sys.executable, "-m", "espnet3_prefect.cli"]


def test_cluster_script_prints_the_job_script_and_submits_nothing(tmp_path):
    cfg = write_yaml(
        tmp_path / "parallel.yaml",
        {
            "inference_dir": str(tmp_path / "inf"),
            "parallel": {
                "env": "pbs",
                "n_workers": 2,
                "options": {
                    "queue": "gpu",
                    "cores": 4,
                    "memory": "16GB",
                    "walltime": "02:00:00",
                    "resource_spec": "select=1:ngpus=1",
                },
            },
        },
    )
    proc = subprocess.run(
        [*CLI, "cluster-script", "--config", str(cfg), "parallel.options.queue=long"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("#!/usr/bin/env bash\n") and "#PBS -q long" in out and "#PBS -N e3p-preview" in out
    assert f"#PBS -e {tmp_path}/inf/.dask-jobs/e3p-preview/" in out
    assert "--lifetime 6540s --lifetime-stagger 300s" in out and "--dashboard-address 127.0.0.1:0" in out
    assert not (tmp_path / "inf").exists()  # nothing created, nothing submitted


def test_cluster_script_bad_config_is_one_line_exit_2(tmp_path):
    cfg = write_yaml(
        tmp_path / "c.yaml", {"parallel": {"env": "slurm", "options": {"cores": 2, "memory": "4GB", "walltime": 3600}}}
    )
    proc = subprocess.run([*CLI, "cluster-script", "--config", str(cfg)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: parallel.options.walltime: must be a string like 'MM, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]', got 3600 "
        "(YAML reads an unquoted 1:00:00 as a number: quote it)"
    ]


def test_cluster_script_for_the_shipped_slurm_deployment_file():
    proc = subprocess.run(
        [*CLI, "cluster-script", "--config", "recipes/dtmf/conf/inference.yaml", "deployments/parallel_slurm.yaml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH -t 00:30:00" in proc.stdout and "--lifetime 1620s --lifetime-stagger 90s" in proc.stdout


class _Log:
    def __init__(self):
        self.lines = []

    def _add(self, level, msg, *args):
        self.lines.append((level, msg % args))

    def info(self, msg, *args):
        self._add("info", msg, *args)

    def warning(self, msg, *args):
        self._add("warning", msg, *args)

    def error(self, msg, *args):
        self._add("error", msg, *args)

    def debug(self, msg, *args):
        pass


class _NoWorkers:
    workers: dict = {}
    scheduler_info = {"workers": {}}


def test_watcher_warns_while_no_worker_connects_and_fails_on_rejected_submissions(tmp_path):
    from espnet3_prefect.execution.backends.watcher import JobWatcher

    log, aborted = _Log(), []
    watcher = JobWatcher(
        backends.get("pbs"),
        "e3p-0123456789",
        tmp_path,
        _NoWorkers(),
        log,
        expected_jobs=2,
        abort=lambda: aborted.append(True),
        poll_s=0.05,
        start_warn_s=0.2,
    )
    watcher.start()
    time.sleep(0.6)
    watcher.stop()
    warnings = [m for level, m in log.lines if level == "warning"]
    assert warnings and warnings[0].startswith("no Dask worker connected") and "e3p-0123456789" in warnings[0]
    assert watcher.error is None and not aborted

    errors = [
        RuntimeError(
            "Command exited with non-zero exit code.\nExit code: 1\nCommand:\nqsub x.sh\n"
            "stdout:\n\nstderr:\nqsub: Unknown queue\n"
        )
    ] * 2
    log = _Log()
    watcher = JobWatcher(
        backends.get("pbs"),
        "e3p-0123456789",
        tmp_path,
        _NoWorkers(),
        log,
        expected_jobs=2,
        abort=lambda: aborted.append(True),
        poll_s=0.05,
        submit_errors=errors,
    )
    watcher.start()
    watcher.join(timeout=5)
    assert (
        aborted
        and str(watcher.error) == "parallel.env 'pbs': the scheduler rejected the worker jobs: qsub: Unknown queue"
    )
    assert [m for level, m in log.lines if level == "warning"] == [
        "the pbs scheduler rejected a worker job: qsub: Unknown queue"
    ]


def test_cluster_script_of_a_placed_stage_prints_its_job_and_creates_nothing(tmp_path):
    """``cluster-script --stage train``: the job a placed train is submitted as (the stage job's command
    where a worker's would be), its folder under ``exp_dir`` named but not created; a missing or bad
    placement is one line naming the key."""
    exp = tmp_path / "exp" / "train"
    options = {"queue": "gpu", "cores": 8, "memory": "60GB", "walltime": "1-00:00:00"}
    options["job_extra_directives"] = ["--gres=gpu:2"]
    cfg = write_yaml(
        tmp_path / "training.yaml", {"exp_dir": str(exp), "placement": {"train": {"env": "slurm", "options": options}}}
    )
    proc = subprocess.run(
        [*CLI, "cluster-script", "--config", str(cfg), "--stage", "train"], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH -J e3p-train-preview" in proc.stdout and "#SBATCH --gres=gpu:2" in proc.stdout
    assert f"-m espnet3_prefect.execution.stage_job {exp}/.stage-jobs/train >> " in proc.stdout
    assert "dask_worker" not in proc.stdout and not (tmp_path / "exp").exists()
    proc = subprocess.run(
        [*CLI, "cluster-script", "--config", str(cfg), "--stage", "pack_model"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: placement.pack_model: not in the given config (the config pack_model reads places it)"
    ]
