"""Job scripts for the schedulers we cannot run here (pbs, lsf, htcondor, moab, oar) and the ones we
can (slurm, sge), plus the kube cluster spec: snapshots of what would be submitted.

The script is rendered by dask-jobqueue from our cluster arguments, without a scheduler and
without submitting. Volatile parts are normalised: the Python path, the scheduler address and
ports. Update after an intended change with:

    E3P_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/unit/test_job_scripts.py
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from espnet3_prefect.execution import backends
from espnet3_prefect.execution.backends import cluster_kwargs
from espnet3_prefect.execution.backends.kube import render_kube_spec
from espnet3_prefect.execution.backends.preview import dump_yaml, render_job_script
from espnet3_prefect.execution.spec import ParallelSpec


def load_cluster_class(env):
    return backends.get(env).load_cluster_class()


SNAPSHOTS = Path(__file__).resolve().parents[1] / "snapshots"
JOB_NAME = "e3p-0123456789"
LOG_DIR = f"/shared/exp/inference/.dask-jobs/{JOB_NAME}"
ENVIRON = {"PREFECT_API_URL": "http://login01:4200/api", "PYTHONPATH": "/home/user/recipes/asr"}
PROLOGUE = ["module load cuda/12.1", "source /home/user/venvs/espnet/bin/activate"]

BLOCKS = {
    "slurm_gpu": {
        "env": "slurm",
        "n_workers": 4,
        "options": {
            "queue": "gpu",
            "account": "speech-lab",
            "cores": 8,
            "processes": 1,
            "memory": "64GB",
            "walltime": "04:00:00",
            "interface": "ib0",
            "job_extra_directives": ["--gres=gpu:1", "--constraint=a100"],
            "job_script_prologue": PROLOGUE,
        },
    },
    "sge_gpu": {
        "env": "sge",
        "n_workers": 2,
        "options": {
            "queue": "gpu.q",
            "project": "speech-lab",
            "cores": 4,
            "processes": 1,
            "memory": "32GB",
            "resource_spec": "gpu=1,h_vmem=8G",
            "walltime": "02:00:00",
            "job_script_prologue": PROLOGUE,
        },
    },
    "pbs_gpu": {
        "env": "pbs",
        "n_workers": 4,
        "options": {
            "queue": "gpu",
            "account": "speech-lab",
            "cores": 8,
            "processes": 1,
            "memory": "64GB",
            "resource_spec": "select=1:ncpus=8:ngpus=1:mem=64GB",
            "walltime": "04:00:00",
            "job_script_prologue": PROLOGUE,
        },
    },
    "lsf_gpu": {
        "env": "lsf",
        "n_workers": 2,
        "options": {
            "queue": "gpu",
            "project": "speech-lab",
            "cores": 4,
            "processes": 1,
            "memory": "32GB",
            "walltime": "02:00",
            "job_extra_directives": ['-gpu "num=1:mode=exclusive_process"'],
            "job_script_prologue": PROLOGUE,
        },
    },
    "htcondor_gpu": {
        "env": "htcondor",
        "n_workers": 2,
        "options": {
            "cores": 4,
            "processes": 1,
            "memory": "16GB",
            "disk": "10GB",
            "job_extra_directives": {"request_gpus": "1", "+ProjectName": '"speech-lab"'},
            "job_script_prologue": PROLOGUE,
        },
    },
    "moab_cpu": {
        "env": "moab",
        "n_workers": 8,
        "options": {
            "queue": "batch",
            "account": "speech-lab",
            "cores": 8,
            "processes": 2,
            "memory": "32GB",
            "walltime": "08:00:00",
            "resource_spec": "nodes=1:ppn=8",
            "job_script_prologue": PROLOGUE,
        },
    },
    "oar_cpu": {
        "env": "oar",
        "n_workers": 2,
        "options": {
            "queue": "default",
            "project": "speech-lab",
            "cores": 4,
            "processes": 1,
            "memory": "16GB",
            "walltime": "02:00:00",
            "memory_per_core_property_name": "memcore",
            "job_extra_directives": ["-t besteffort"],
            "job_script_prologue": PROLOGUE,
        },
    },
    "slurm_margin": {
        "env": "slurm",
        "n_workers": 2,
        "lifetime_margin_s": 900,
        "options": {
            "queue": "long",
            "cores": 2,
            "memory": "8GB",
            "walltime": "1-00:00:00",
            "job_name": "asr-decode",
            "log_directory": "/scratch/user/dask-logs",
            "worker_extra_args": ["--dashboard-address", ":8790"],
        },
    },
}


def normalise(text: str) -> str:
    """Replace what changes between machines and runs: python path, scheduler address, ports."""
    text = text.replace(sys.executable, "<python>")
    text = re.sub(r"(tcp|tls)://<[^\s'\"]+", r"\1://<scheduler>", text)
    return re.sub(r"(127\.0\.0\.1|localhost):[1-9][0-9]*", r"\1:<port>", text)


def check_snapshot(name: str, text: str) -> None:
    path = SNAPSHOTS / f"{name}.txt"
    if os.environ.get("E3P_UPDATE_SNAPSHOTS") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"no snapshot {path}: run with E3P_UPDATE_SNAPSHOTS=1 once"
    assert text == path.read_text(), f"{name}: job script differs from {path}"


def job_script(block: dict) -> str:
    spec = ParallelSpec.from_config(block)
    kwargs = cluster_kwargs(
        spec, job_name=f"{spec.options.get('job_name') or 'e3p'}-0123456789", log_directory=LOG_DIR, environ=ENVIRON
    )
    # what cluster-script prints: the job script, or for OAR (script submitted inline) the oarsub command
    _kind, text = backends.get(spec.env).preview(spec, kwargs)
    return normalise(text)


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_job_script_snapshot(name):
    check_snapshot(f"job_script_{name}", job_script(BLOCKS[name]))


def test_what_every_job_script_gets_from_us():
    for name, block in BLOCKS.items():
        script = job_script(block)
        assert "export PREFECT_API_URL=http://login01:4200/api" in script, name
        assert "export PYTHONPATH=/home/user/recipes/asr" in script, name
        if name != "slurm_margin":
            assert "--dashboard-address 127.0.0.1:0" in script, name  # worker dashboards not on 0.0.0.0
            assert LOG_DIR in script, name
        if block["env"] != "htcondor":  # HTCondor has no walltime in dask-jobqueue
            assert "--lifetime " in script and "--lifetime-stagger " in script, name
    # the user's options win: own dashboard address, own log folder; job_name becomes the prefix
    script = job_script(BLOCKS["slurm_margin"])
    assert "--dashboard-address :8790" in script and "127.0.0.1:0" not in script
    assert "#SBATCH -e /scratch/user/dask-logs/asr-decode-0123456789-%J.err" in script
    assert "--lifetime 85200s --lifetime-stagger 300s" in script  # 24 h - 900 s margin - 300 s stagger


def test_rendering_submits_nothing_and_creates_no_folder(tmp_path):
    logs = tmp_path / "not" / "yet"
    spec = ParallelSpec.from_config({"env": "slurm", "options": {"cores": 1, "memory": "1GB"}})
    script = render_job_script(load_cluster_class("slurm"), cluster_kwargs(spec, log_directory=str(logs), environ={}))
    assert f"#SBATCH -e {logs}/e3p-preview-%J.err" in script
    assert not (tmp_path / "not").exists()


KUBE_BLOCK = {
    "env": "kube",
    "n_workers": 3,
    "options": {
        "image": "registry.example.org/speech/e3p-asr:1.4",
        "namespace": "speech",
        "resources": {
            "limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"},
            "requests": {"cpu": "4", "memory": "16Gi"},
        },
        "env": {"HF_HOME": "/cache/hf"},
    },
}


def kube_kwargs() -> dict:
    return cluster_kwargs(ParallelSpec.from_config(KUBE_BLOCK), job_name=JOB_NAME, environ=ENVIRON)


def test_kube_cluster_arguments_snapshot():
    check_snapshot("kube_cluster_arguments", normalise(dump_yaml(kube_kwargs())))


def test_kube_cluster_resource_snapshot():
    pytest.importorskip("dask_kubernetes", reason='dask-kubernetes not installed (pip install "espnet3-prefect[kube]")')
    check_snapshot("kube_dask_cluster", normalise(dump_yaml(render_kube_spec(kube_kwargs()))))


#: the blocks a placed ``train`` is snapshot-tested with (``placement.train``: one job, no n_workers)
TRAIN_JOB_BLOCKS = ("slurm_gpu", "sge_gpu", "pbs_gpu", "lsf_gpu", "oar_cpu")


@pytest.mark.parametrize("name", TRAIN_JOB_BLOCKS)
def test_train_job_script_snapshot(name, tmp_path):
    """What a placed ``train`` submits: the worker's directives and exports, the stage job's command."""
    from espnet3_prefect.execution.stage_job import BatchJob, JobPaths
    from espnet3_prefect.recipe.placement import placement_spec

    block = {key: value for key, value in BLOCKS[name].items() if key != "n_workers"}
    spec = placement_spec(block, "placement.train")
    paths = JobPaths(tmp_path / "exp" / "train" / ".stage-jobs" / "train")
    job = BatchJob(backends.get(spec.env), spec, paths, "e3p-train-0123456789", cwd=tmp_path, environ=ENVIRON)
    text = job.script().replace(str(tmp_path.resolve()), "/shared/recipe")
    assert "distributed.cli.dask_worker" not in text and "-m espnet3_prefect.execution.stage_job" in text
    check_snapshot(f"train_job_script_{name}", normalise(text))
