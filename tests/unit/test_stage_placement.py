"""A stage placed elsewhere (espnet3_prefect.recipe.placement, execution/stage_job.py): the placement
block checked on one line before anything starts, a placed stage run as a real child process that
records as the stage would here, a job that dies naming itself, and the resume of a killed placed
``train``. The small system is tests/unit/test_recipe_stages.py's; the batch schedulers' scripts are
snapshot-tested in tests/unit/test_job_scripts.py and a real SLURM job runs in tests/infra."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution.stage_job import JOBS_DIRNAME, JobPaths, ProcessJob, wait_for, write_payload
from espnet3_prefect.recipe.driver import CACHED, COMPLETED, StageFailed, drive_recipe
from espnet3_prefect.recipe.placement import placements
from espnet3_prefect.recipe.record import read_record, record_path
from tests.unit.test_recipe_stages import Calls, ToySystem, configs, drive, recipe_run

pytestmark = pytest.mark.usefixtures("in_recipe_folder")


@pytest.fixture
def in_recipe_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def placed(**block):
    training, inference, metrics = configs()
    training["placement"] = {"train": block or {"env": "local"}}
    return ToySystem(training, inference, metrics)


class PidSystem(ToySystem):
    """Its train notes which process ran it, the checkpoint it was told to resume from, and can be
    made to stop half-way (a checkpoint written, then waiting to be killed)."""

    def train(self):
        exp = Path(self.training_config.exp_dir)
        exp.mkdir(parents=True, exist_ok=True)
        (exp / "pid.txt").write_text(str(os.getpid()))
        resumed = self.training_config.get("fit", {}).get("ckpt_path")
        (exp / "resumed_from.txt").write_text(str(resumed))
        super().train()
        if self.training_config.get("hang") and not resumed:
            (exp / "step1.ckpt").write_text("half-way\n")
            time.sleep(120)


def pid_system(**extra):
    training, inference, metrics = configs()
    training.update({"placement": {"train": {"env": "local"}}, **extra})
    return PidSystem(training, inference, metrics)


@pytest.mark.parametrize(
    ("place", "message"),
    [
        ({"transcribe": {"env": "local"}}, "placement.transcribe: ToySystem has no stage 'transcribe'"),
        ({"infer": {"env": "local"}}, "placement.infer: infer runs where its own config's parallel block says"),
        ({"train": {"env": "local", "n_workers": 4}}, "placement.train.n_workers: a placed stage is one job"),
        ({"train": {"env": "lokal"}}, "placement.train.env: unknown backend 'lokal'"),
        ({"train": {"env": "local", "options": {"cores": 2}}}, "placement.train.options.cores: a batch-scheduler"),
        ({"train": {"env": "local", "options": {"memory_limit": "4GB"}}}, "placement.train.options.memory_limit: env"),
        ({"train": {"env": "ssh"}}, "placement.train.env: 'ssh' cannot run one stage job"),
        ({"train": "slurm"}, "placement.train: must be a mapping like a parallel block"),
    ],
)
def test_a_bad_placement_is_one_line_naming_the_key(place, message):
    training, inference, metrics = configs()
    training["placement"] = place
    with pytest.raises(ConfigError) as caught:
        placements(ToySystem(training, inference, metrics))
    assert str(caught.value).startswith(message) and "\n" not in str(caught.value)


def test_a_placement_in_a_config_the_stage_does_not_read_is_refused():
    training, inference, metrics = configs()
    inference["placement"] = {"train": {"env": "local"}}
    with pytest.raises(ConfigError, match=r"^placement.train: train reads the training config; place it there"):
        placements(ToySystem(training, inference, metrics))


def test_a_placed_train_runs_in_a_process_of_its_own_and_records_as_here():
    run = recipe_run(system=pid_system())
    rows, _ = drive(run)
    assert rows["train"].state == COMPLETED and rows["train"].node_hours is not None
    assert int(Path("exp/train/pid.txt").read_text()) != os.getpid()  # not in the driver's process
    assert run.system.ran == ["create_dataset", "infer", "measure"]  # train ran in the job, not here
    record = read_record(record_path(run.system, "train"))
    assert sorted(record.outputs) == [
        "exp/train/config.yaml",
        "exp/train/pid.txt",
        "exp/train/resumed_from.txt",
        "exp/train/step1.ckpt",
    ]
    assert (Path("exp/train") / JOBS_DIRNAME / "train" / "result.json").is_file()  # beside, never an output
    again, _ = drive(recipe_run(system=pid_system()))
    assert {row.state for row in again.values()} == {CACHED}


def test_editing_a_placement_reruns_nothing():
    drive(recipe_run(system=placed()))
    rows, _ = drive(recipe_run())  # the same configs, train now unplaced
    assert {row.state for row in rows.values()} == {CACHED}


def test_a_placed_stage_that_raises_fails_with_the_error_it_fails_with_here():
    said = []
    for place in ({"env": "local"}, None):
        system = pid_system(optimizer="not a mapping", placement={"train": place} if place else None)
        with pytest.raises(StageFailed) as caught:
            drive_recipe(recipe_run(system=system), Calls())
        said.append(str(caught.value))
    assert said == ["stage 'train' failed: AttributeError: 'str' object has no attribute 'lr'"] * 2


def test_a_killed_placed_train_fails_naming_its_job_and_the_rerun_resumes_from_its_checkpoint():
    run = recipe_run(system=pid_system(hang=True))
    killer = threading.Thread(target=_kill_train_when_half_way, daemon=True)
    killer.start()
    started = time.monotonic()
    with pytest.raises(StageFailed) as caught:
        drive_recipe(run, Calls())
    assert time.monotonic() - started < 60
    message = str(caught.value)
    assert message.startswith("stage 'train' failed: process ") and "ended killed by SIGKILL" in message
    assert "before the stage finished" in message
    rows, _ = drive(recipe_run(system=pid_system(hang=True)))
    assert rows["create_dataset"].state == CACHED
    assert rows["train"].state == COMPLETED and rows["train"].why.startswith(
        "train: resuming from exp/train/step1.ckpt"
    )
    assert Path("exp/train/resumed_from.txt").read_text().endswith("exp/train/step1.ckpt")


def _kill_train_when_half_way():
    deadline = time.monotonic() + 60
    ckpt, pid = Path("exp/train/step1.ckpt"), Path("exp/train/pid.txt")
    while time.monotonic() < deadline:
        if ckpt.is_file() and ckpt.read_text() == "half-way\n" and pid.is_file():
            os.kill(int(pid.read_text()), signal.SIGKILL)
            return
        time.sleep(0.1)


def test_a_stop_cancels_the_job_and_leaves_no_process(tmp_path):
    paths = JobPaths(tmp_path / "job")
    write_payload(paths, _sleep_long, None)
    job = ProcessJob(paths, cwd=tmp_path)
    job.submit()
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    from espnet3_prefect.execution.stage_job import JobCancelled

    with pytest.raises(JobCancelled, match=r"^process \d+ cancelled$"):
        wait_for(job, paths, stop=stop, poll_s=0.2)
    assert job.process.poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(job.process.pid, 0)  # no process of its session is left


def _sleep_long():
    time.sleep(300)
