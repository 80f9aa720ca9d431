"""ESPnet's mini_an4 from the 202611 wheel as a whole recipe on the real SLURM of tests/infra, started as
``prefect deployment run recipe/slurm`` (deploy-local: a server and a process worker, the project's
prefect.yaml): ``collect_stats`` on 2 SLURM jobs, ``train`` as one SLURM job, ``infer`` on 2, ``measure``
in the flow. What does not depend on the trained weights (training has no seed) is compared byte for
byte with the upstream oracle's (conftest.py), as tests/realespnet/test_recipe_flow.py compares the
local run (``config.yaml`` beyond its ``parallel`` block, which ``place`` replaced). CPU "GPU" jobs:
``cores`` instead of ``gres`` on this single-node SLURM.

    eval "$(tests/infra/up.sh slurm)"
    E3P_REQUIRE_REAL_ESPNET=1 .venv-espnet/bin/python -m pytest tests/realespnet/test_recipe_slurm.py
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from .conftest import copy_recipe, recipe_env, record_time
from .test_recipe_flow import assert_data_and_stats_as_upstreams

pytestmark = [pytest.mark.realespnet, pytest.mark.slow, pytest.mark.slurm]

CONFIG = "exp/training/config.yaml"
STAGES = ["create_dataset", "train_tokenizer", "collect_stats", "train", "infer", "measure"]


def partition() -> str:
    """The partition tests/infra's SLURM exports; skip (fail under E3P_REQUIRE_BACKENDS=1) without it."""
    missing = pytest.fail if os.environ.get("E3P_REQUIRE_BACKENDS") == "1" else pytest.skip
    queue = os.environ.get("E3P_SLURM_PARTITION")
    if not queue or shutil.which("sbatch") is None:
        missing('SLURM not configured: run eval "$(tests/infra/up.sh slurm)" first')
    if subprocess.run(["scontrol", "ping"], capture_output=True, timeout=20).returncode != 0:
        missing("SLURM does not answer (scontrol ping failed): run tests/infra/up.sh slurm")
    return queue


def test_recipe_slurm_runs_mini_an4_train_as_one_job_infer_on_two(mini_an4, tmp_path):
    from tests.helpers.procs import deploy_local

    queue = partition()
    recipe = copy_recipe(tmp_path / "recipe")
    renv = recipe_env(recipe, tmp_path / "recipe-home")

    def recipe_paths(project, env):  # the worker runs the recipe with path.sh's PYTHONPATH and PATH
        env["PYTHONPATH"] = os.pathsep.join([renv["PYTHONPATH"], env["PYTHONPATH"]])
        env["PATH"], env["CUDA_VISIBLE_DEVICES"] = renv["PATH"], ""

    workers = {"queue": queue, "cores": 1, "processes": 1, "memory": "4GB", "walltime": "00:30:00"}  # torch + ESPnet
    place = {
        "collect_stats": {"env": "slurm", "n_workers": 2, "options": workers},
        "train": {"env": "slurm", "options": workers},
        "infer": {"env": "slurm", "n_workers": 2, "options": workers},
    }
    configs = {"training": "conf/training.yaml", "inference": "conf/inference_serial.yaml"}
    configs["metrics"] = "conf/metrics.yaml"
    prefect = str(Path(sys.executable).with_name("prefect"))
    with deploy_local(tmp_path, prepare=recipe_paths) as (proc, state, env):
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        env = {**env, "PREFECT_API_URL": state["api_url"]}
        cmd = [prefect, "deployment", "run", "recipe/slurm", "--watch", "--watch-interval", "1"]
        cmd += ["--param", f"workdir={recipe}", "--param", f"stages={json.dumps(STAGES)}"]
        cmd += ["--param", f"configs={json.dumps(configs)}", "--param", f"place={json.dumps(place)}"]
        started = time.monotonic()
        run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
        record_time("recipe/slurm deployment, all stages", "ours", time.monotonic() - started)
        said = run.stdout + run.stderr
        assert run.returncode == 0 and "Completed" in said, said[-4000:]
    assert subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True).stdout.strip() == ""

    exp = recipe / "exp" / "training"
    result = json.loads((exp / ".stage-jobs" / "train" / "result.json").read_text())
    assert result["state"] == "done" and str(result["job_id"]).isdigit()  # train ran inside a SLURM job
    assert "e3p-train-" in (exp / ".stage-jobs" / "train" / "job.sh").read_text()
    infer_jobs = list((exp / "inference_serial" / ".dask-jobs").glob("*/*.out"))
    assert len({path.name for path in infer_jobs}) == 2, infer_jobs  # infer's 2 worker jobs
    assert '"status": "done"' in (exp / "inference_serial" / "measure.stage.json").read_text()

    oracle = mini_an4.recipe
    assert_data_and_stats_as_upstreams(recipe, oracle)
    # ESPnet3's train writes the whole training config, its parallel block too: here the one place gave
    ours, upstream = (
        yaml.safe_load(p.read_text().replace(str(recipe), str(oracle))) for p in (recipe / CONFIG, oracle / CONFIG)
    )
    assert ours.pop("parallel")["env"] == "slurm" and upstream.pop("parallel")["env"] == "local"
    assert ours == upstream, "config.yaml differs beyond its parallel block"
