"""OAR (backends/oar.py): what the real OAR 2.5.9 of tests/infra showed, without it. Directives reach
oarsub the way OAR reads a script, oarsub runs with PWD = the real cwd, and the queue adapter reads
``oarstat -J`` and cancels only the run's jobs."""

from __future__ import annotations

import asyncio

import pytest

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution import backends
from espnet3_prefect.execution.backends import cluster_kwargs
from espnet3_prefect.execution.backends.oar import oarsub_argv
from espnet3_prefect.execution.backends.preview import render_job_script
from espnet3_prefect.execution.spec import ParallelSpec

OAR = backends.get("oar")


def spec(**options) -> ParallelSpec:
    return ParallelSpec.from_config({"env": "oar", "n_workers": 2, "options": {"cores": 1, "memory": "1GB", **options}})


def oar_script(**options) -> str:
    kwargs = cluster_kwargs(
        spec(walltime="00:10:00", **options), job_name="e3p-0123456789", log_directory="rel/logs", environ={}
    )
    return render_job_script(OAR.load_cluster_class(), kwargs)


def test_oarsub_runs_with_pwd_set_to_the_real_cwd(tmp_path, monkeypatch):
    # oarsub takes the job's folder from $PWD: missing, the real OAR refused every job; stale, the
    # job would start elsewhere. The OAR job class runs its commands with PWD = the real cwd.
    from dask_jobqueue.oar import OARJob
    from dask_jobqueue.slurm import SLURMJob

    assert backends.get("slurm").submit_job_class(SLURMJob) is SLURMJob
    job_cls = OAR.submit_job_class(OARJob)
    assert issubclass(job_cls, OARJob) and job_cls.__name__ == "OARJob"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PWD", "/somewhere/else")
    out = asyncio.run(job_cls._call(["sh", "-c", 'echo "$PWD"']))
    assert out.strip() == str(tmp_path)


def test_the_run_submits_with_the_oar_job_class_and_records_rejections():
    from dask_jobqueue.oar import OARJob

    errors: list = []
    job_cls = cluster_kwargs(spec(), job_name="e3p-0123456789", submit_errors=errors)["job_cls"]
    assert issubclass(job_cls, OARJob) and job_cls._submit_job is not OARJob._submit_job
    assert "job_cls" not in cluster_kwargs(
        ParallelSpec.from_config({"env": "slurm", "options": {"cores": 1, "memory": "1GB"}})
    )  # dask-jobqueue's own class


def test_oar_directives_reach_oarsub_as_oar_reads_a_script(tmp_path, monkeypatch):
    # On the real OAR, dask-jobqueue's shell-splitting of '#OAR -p' lines turned host='vm' into
    # host=vm (column "vm" does not exist); ours passes the rest of the line as is, like oarsub -S.
    monkeypatch.chdir(tmp_path)
    argv = oarsub_argv(
        oar_script(
            memory_per_core_property_name="memcore",
            job_extra_directives=["-p gpu='NO'", "-t besteffort", "-p host='vm'"],
        )
    )
    assert argv[0] == "oarsub" and argv[argv.index("-n") + 1] == "e3p-0123456789"
    assert argv[argv.index("-l") + 1] == "/nodes=1/core=1,walltime=00:10:00"
    assert argv[argv.index("-t") + 1] == "besteffort"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "-p"] == ["(host='vm') AND memcore>=954"]  # last -p wins
    assert argv[argv.index("-O") + 1] == f"{tmp_path}/rel/logs/e3p-0123456789.%jobid%.out"  # absolute
    assert argv[argv.index("-E") + 1] == f"{tmp_path}/rel/logs/e3p-0123456789.%jobid%.err"
    inline = argv[-1]
    assert "#" not in inline and "distributed.cli.dask_worker" in inline  # no shebang, no directives


def test_oar_memory_property_and_own_log_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = oarsub_argv(
        oar_script(memory_per_core_property_name="not_applicable", job_extra_directives=["-O /mine/%jobid%.out"])
    )
    assert "-p" not in argv and argv[argv.index("-O") + 1] == "/mine/%jobid%.out"
    assert argv[argv.index("-E") + 1].endswith("/rel/logs/e3p-0123456789.%jobid%.err")
    argv = oarsub_argv(oar_script(cores=2, memory="3GB", memory_per_core_property_name="mem_core"))
    assert argv[argv.index("-p") + 1] == "mem_core>=1431"  # MiB per core, rounded up
    with pytest.raises(ConfigError, match="parallel.options.memory_per_core_property_name: must be an OAR property"):
        spec(memory_per_core_property_name="mem core")  # checked with the config


def test_oar_queue_reads_oarstat_json_and_cancels_with_oardel(tmp_path, monkeypatch):
    # The shape the real OAR 2.5.9 prints for `oarstat -u e3p -J` (trimmed); nothing at all without jobs.
    listing = tmp_path / "listing.json"
    listing.write_text(
        '{"41": {"name": "e3p-6d7e8f9a0b", "state": "Running", "owner": "e3p"},'
        ' "9": {"name": null, "state": "Waiting", "owner": "e3p"},'
        ' "40": {"name": "e3p-6d7e8f9a0b", "state": "Finishing", "owner": "e3p"}}'
    )
    (tmp_path / "oarstat").write_text(f'#!/bin/sh\ncat "{listing}"\n')
    (tmp_path / "oardel").write_text(f'#!/bin/sh\necho "$@" >> "{tmp_path}/deleted"; : > "{listing}"\n')
    for name in ("oarstat", "oardel"):
        (tmp_path / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    queue = OAR.queue
    assert [(j.job_id, j.name, j.state) for j in queue.jobs()] == [
        ("9", "", "Waiting"),
        ("40", "e3p-6d7e8f9a0b", "Finishing"),
        ("41", "e3p-6d7e8f9a0b", "Running"),
    ]
    assert "Finishing" in queue.ended_states
    assert queue.cancel_run("6d7e8f9a0b", wait_s=10) == []
    assert (tmp_path / "deleted").read_text().split() == ["40", "41"]  # only this run's jobs
    assert queue.jobs() == []  # empty output: no jobs
