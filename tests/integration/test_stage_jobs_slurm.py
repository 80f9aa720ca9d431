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
import threading
import time
from pathlib import Path

import pytest

from espnet3_prefect.execution.backends.jobs import run_tag as jobs_tag
from espnet3_prefect.execution.backends.slurm import SlurmQueue
from tests.conftest import toy_config
from tests.integration.test_real_backends import batch_parallel, slurm, wait_no_jobs  # noqa: F401  (slurm: a fixture)
from tests.integration.test_recipe_flow import SlowSystem, cancel_when, children, run_flow
from tests.unit.test_recipe_stages import ToySystem, configs, recipe_run

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


class SlurmInferSystem(ToySystem):
    """Its infer is the real ``infer`` flow (ESPnet3's entry point) on SLURM workers: 4 shards of slow items."""

    def infer(self):
        from espnet3_prefect.entry import infer

        infer(self.inference_config)


def infer_system(slurm, tmp_path):  # noqa: F811
    training, _, metrics = configs()
    inference = toy_config(tmp_path, n=12, num_shards=4)
    inference["model"]["sleep_s"] = 1.0
    inference["parallel"] = batch_parallel(slurm, n_workers=2, num_shards=4)
    metrics["inference_dir"] = inference["inference_dir"]
    return SlurmInferSystem(training, inference, metrics)


def test_cancelling_the_recipe_during_infer_on_slurm_leaves_no_job_and_the_rerun_keeps_done_shards(
    slurm,  # noqa: F811
    prefect_server,
    tmp_path,
    monkeypatch,
):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    monkeypatch.chdir(tmp_path)
    run = recipe_run(system=infer_system(slurm, tmp_path))
    markers = tmp_path / "inference" / "test_a"
    first_done = threading.Event()

    def when_a_shard_is_done():
        deadline = time.monotonic() + 300
        while not list(markers.glob("split.*/done")) and time.monotonic() < deadline:
            time.sleep(0.2)
        first_done.set()

    threading.Thread(target=when_a_shard_is_done, daemon=True).start()
    canceller = cancel_when(tmp_path / "first-shard-done", "infer on slurm")
    threading.Thread(
        target=lambda: first_done.wait(300) and (tmp_path / "first-shard-done").write_text(""), daemon=True
    ).start()
    state = run_flow(run)
    assert state.is_cancelled(), state
    assert time.monotonic() - canceller.cancelled_at[0] < 30
    with get_client(sync_client=True) as client:
        [infer_run] = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[state.state_details.flow_run_id])
            )
        )
    assert infer_run.name and infer_run.state.type.value == "CANCELLED", infer_run.state
    assert wait_no_jobs("slurm", jobs_tag(infer_run.id), timeout_s=30) == []  # none queued or running
    done = {path: path.stat().st_mtime_ns for path in markers.glob("split.*/done")}
    assert 1 <= len(done) < 4, done
    assert {row.stage: row.state for row in run.rows}["infer"] == "Cancelled"

    again = recipe_run(system=infer_system(slurm, tmp_path))
    state = run_flow(again)
    assert state.is_completed(), state
    assert {path: path.stat().st_mtime_ns for path in done} == done  # the finished shards were not redone
    assert len(list(markers.glob("split.*/done"))) == 4
