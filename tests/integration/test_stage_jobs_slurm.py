"""A placed ``train`` as one job of the real SLURM of tests/infra (no mocks): the stage recorded as it is
when it runs here, its job named after the recipe run and the stage; the job ``scancel``led mid-way
fails the stage naming the job and its state, and the re-run resumes from its checkpoint; cancelling the
recipe's flow run leaves no job of it in ``squeue``. The recipe is the small system of
tests/unit/test_recipe_stages.py; ESPnet's mini_an4 with a placed ``train`` runs in tests/realespnet.

    eval "$(tests/infra/up.sh slurm)"
    .venv/bin/python -m pytest tests/integration/test_stage_jobs_slurm.py
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from espnet3_prefect.execution.backends.slurm import SlurmQueue
from tests.integration.test_real_backends import slurm  # noqa: F401  (the fixture: SLURM is up, or skip)
from tests.integration.test_recipe_flow import SlowSystem, cancel_when, children, run_flow
from tests.unit.test_recipe_stages import configs, recipe_run

pytestmark = [pytest.mark.slow, pytest.mark.slurm]


class CheckpointSystem(SlowSystem):
    """Its slow train writes a checkpoint first, then waits (to be scancelled); it notes what it resumed."""

    def train(self):
        exp = Path(self.training_config.exp_dir)
        exp.mkdir(parents=True, exist_ok=True)
        resumed = self.training_config.get("fit", {}).get("ckpt_path")
        (exp / "resumed_from.txt").write_text(str(resumed))
        (exp / "job.txt").write_text(os.environ.get("SLURM_JOB_ID", "not a SLURM job"))
        if self.training_config.get("slow") and not resumed:
            (exp / "step1.ckpt").write_text("half-way\n")
        else:
            self.training_config.slow = False
        super().train()


def placed_system(slurm, slow=False):  # noqa: F811
    training, inference, metrics = configs()
    options = {"cores": 1, "memory": "1GB", "walltime": "00:10:00", "queue": slurm["queue"]}
    training.update(slow=slow, placement={"train": {"env": "slurm", "options": options}})
    return CheckpointSystem(training, inference, metrics)


def our_jobs(prefix: str = "e3p-train-") -> list:
    return [job for job in SlurmQueue().jobs() if job.name.startswith(prefix)]


def wait_for_file(path: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert path.is_file(), f"{path} never appeared"


def test_a_placed_train_is_one_slurm_job_named_after_the_run(slurm, prefect_server, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    run = recipe_run(system=placed_system(slurm))
    state = run_flow(run)
    assert state.is_completed(), state
    job_id = Path("exp/train/job.txt").read_text()
    assert job_id.isdigit()  # train ran inside a SLURM job
    assert run.jobs["train"].job_id == job_id
    rows = {row.stage: row for row in run.rows}
    assert rows["train"].state == "Completed" and rows["train"].node_hours is not None
    script = (Path("exp/train") / ".stage-jobs" / "train" / "job.sh").read_text()
    tag = str(state.state_details.flow_run_id).replace("-", "")[-10:]
    assert f"#SBATCH -J e3p-train-{tag}" in script  # squeue shows which run and stage it serves
    tasks = children(state.state_details.flow_run_id, {"train"})
    assert tasks["train"][0] == "Completed"
    assert our_jobs() == []


def test_a_scancelled_train_job_fails_naming_it_and_the_rerun_resumes(slurm, prefect_server, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    run = recipe_run(system=placed_system(slurm, slow=True))
    ckpt = Path("exp/train/step1.ckpt")

    def scancel_when_half_way():
        wait_for_file(ckpt)
        job_id = Path("exp/train/job.txt").read_text()
        subprocess.run(["scancel", job_id], check=True, timeout=30)
        scancelled.append((job_id, time.monotonic()))

    import threading

    scancelled: list = []
    threading.Thread(target=scancel_when_half_way, daemon=True).start()
    state = run_flow(run)
    assert state.is_failed()
    job_id, at = scancelled[0]
    assert time.monotonic() - at < 60
    message = str(state.message)
    assert message.startswith(f"stage 'train' failed: SLURM job {job_id} (e3p-train-"), message
    assert "ended CANCELLED" in message and "before the stage finished" in message, message

    again = recipe_run(system=placed_system(slurm, slow=True))
    state = run_flow(again)
    assert state.is_completed(), state
    rows = {row.stage: row for row in again.rows}
    assert rows["create_dataset"].state == "Cached"
    assert rows["train"].why.startswith("train: resuming from exp/train/step1.ckpt"), rows["train"].why
    assert Path("exp/train/resumed_from.txt").read_text().endswith("exp/train/step1.ckpt")
    assert our_jobs() == []


def test_cancelling_the_recipe_during_a_slurm_train_leaves_no_job(slurm, prefect_server, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(tmp_path)
    run = recipe_run(system=placed_system(slurm, slow=True))
    canceller = cancel_when(Path("exp/train/step1.ckpt"), "slurm train")
    state = run_flow(run)
    assert state.is_cancelled(), state
    assert our_jobs() == []  # none queued or running once the parent is Cancelled
    assert time.monotonic() - canceller.cancelled_at[0] < 30
    tasks = children(state.state_details.flow_run_id, {"create_dataset"})
    assert tasks["train"][0] == "Cancelled" and "infer" not in tasks
