"""The flow ``recipe`` on a real Prefect server: the stages as children, Cached task runs on a re-run,
the stage's log lines in its task run, the stage table artifact, and a failed stage failing the parent
with its name. The recipe is the small system of tests/unit/test_recipe_stages.py (real files, no
ESPnet); ESPnet's own mini_an4 goes through it in tests/realespnet/test_recipe_flow.py."""

from __future__ import annotations

import contextvars
import logging
import os
import threading
import time
from pathlib import Path

import pytest
from prefect import flow

from espnet3_prefect.recipe.driver import StageFailed
from tests.helpers.api_reads import artifacts_of
from tests.unit.test_recipe_stages import ToySystem, configs, recipe_run

pytestmark = pytest.mark.slow


def run_flow(run):
    from espnet3_prefect.flows.recipe import recipe

    flow = recipe.with_options(flow_run_name=run.name)
    return flow(stages=run.stages, configs={}, rerun=run.rerun, prepared=run, return_state=True)


def children(flow_run_id, expected: set[str]) -> dict[str, tuple[str, str | None, object]]:
    """``{task run name: (state name, state message, task run id)}`` of a flow run, once the server's
    recorder has written the ``expected`` ones in a final state (it writes task runs from their events,
    each second). Filtered by the flow run: the suite's server holds thousands of other task runs."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    deadline = time.monotonic() + 60
    while True:
        with get_client(sync_client=True) as client:
            runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        found = {
            run.name: (run.state.name, run.state.message, run.id) for run in runs if run.state and run.state.is_final()
        }
        if expected <= set(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def logs_of(flow_run_id) -> list[tuple[str, str | None]]:
    from prefect import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # what the run logged and is still queued in this process
    with get_client(sync_client=True) as client:
        found = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return [(log.message, log.task_run_id) for log in found]


def test_a_recipe_is_one_flow_run_its_stages_children_cached_on_a_rerun(prefect_server, tmp_path, monkeypatch):
    from prefect import get_client

    monkeypatch.chdir(tmp_path)
    first = recipe_run()
    original = first.run_stage

    def talkative(stage):  # a stage's own logging, as ESPnet3's stages log
        logging.getLogger("espnet3.systems.toy").info("toy stage %s says hello", stage)
        original(stage)

    first.run_stage = talkative
    monkeypatch.setattr(logging.getLogger("espnet3"), "level", logging.INFO)  # as ESPnet3's launcher has it
    state = run_flow(first)
    assert state.is_completed(), state
    flow_run_id = state.state_details.flow_run_id
    tasks = children(flow_run_id, {"create_dataset", "train"})
    assert {name: tasks[name][0] for name in ("create_dataset", "train")} == {
        "create_dataset": "Completed",
        "train": "Completed",
    }
    said = logs_of(flow_run_id)
    stage_lines = {message: task for message, task in said if message.startswith("toy stage ")}
    assert set(stage_lines) == {f"toy stage {s} says hello" for s in ("create_dataset", "train", "infer", "measure")}
    with get_client(sync_client=True) as client:
        table = [a for a in artifacts_of(client, flow_run_id) if a.key == "recipe-stages"]
    assert stage_lines["toy stage train says hello"] == tasks["train"][2]  # under the stage's own task run
    assert len(table) == 1 and "| train | Completed |" in table[0].data
    assert "| `exp/train/train.log` |" in table[0].data  # where ESPnet3 writes the stage's own log
    assert '| WER | test | {"WER": 1.0} |' in table[0].data  # measure's scores beside the table

    again = run_flow(recipe_run())
    assert again.is_completed()
    tasks = children(again.state_details.flow_run_id, {"create_dataset", "train", "infer", "measure"})
    assert {name: state for name, (state, _, _) in tasks.items()} == dict.fromkeys(
        ("create_dataset", "train", "infer", "measure"), "Cached"
    )
    assert "inputs unchanged" in tasks["train"][1]


def test_a_failed_stage_fails_the_recipe_with_its_name_and_first_line(prefect_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = recipe_run()
    run.system.fail = "train"
    state = run_flow(run)
    assert state.is_failed()
    assert state.message == "stage 'train' failed: RuntimeError: train broke"
    with pytest.raises(StageFailed):
        state.result()
    tasks = children(state.state_details.flow_run_id, {"create_dataset", "train"})
    assert tasks["create_dataset"][0] == "Completed" and tasks["train"][0] == "Failed"
    assert "infer" not in tasks and "measure" not in tasks  # the later stages did not start


class SlowSystem(ToySystem):
    """Its train (placed or not) or its infer (a subflow run, as ours are) waits until cancelled."""

    def train(self):
        exp = Path(self.training_config.exp_dir)
        exp.mkdir(parents=True, exist_ok=True)
        print(f"toy train runs in process {os.getpid()}", flush=True)  # in a placed job: its job.out
        time.sleep(1.5)  # the driver's wait reads the job's output each second
        (exp / "pid.txt").write_text(str(os.getpid()))
        if self.training_config.get("slow"):
            for _ in range(1200):
                time.sleep(0.1)
        super().train()

    def infer(self):
        if self.inference_config.get("slow"):
            slow_subflow()
        super().infer()


@flow(name="infer")
def slow_subflow():
    Path("infer_started").write_text("")
    for _ in range(1200):
        time.sleep(0.1)


def cancel_when(path: Path, which: str, flow_name: str = "recipe") -> threading.Thread:
    """A thread that cancels (as the UI does: the state Cancelling) the newest flow run named
    ``flow_name`` once ``path`` exists."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.states import Cancelling

    def cancel():
        deadline = time.monotonic() + 120
        while not path.is_file() and time.monotonic() < deadline:
            time.sleep(0.1)
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])), sort=FlowRunSort.START_TIME_DESC, limit=1
            )
            client.set_flow_run_state(runs[0].id, Cancelling(message=f"test: {which}"), force=True)
        cancelled_at.append(time.monotonic())

    cancelled_at: list[float] = []
    # with this thread's Prefect settings (the suite's server): a context, not the environment
    thread = threading.Thread(target=contextvars.copy_context().run, args=(cancel,), daemon=True)
    thread.cancelled_at = cancelled_at
    thread.start()
    return thread


@pytest.mark.parametrize("where", ["placed train", "train here", "infer subflow"])
def test_cancelling_the_recipe_or_a_stage_subflow_stops_the_stage_and_starts_no_later_one(
    prefect_server, tmp_path, monkeypatch, where
):
    """The UI's cancel of the recipe's flow run (or of the running stage's subflow run) while a stage runs:
    a placed stage's job process is gone, a stage running in the flow's process is interrupted; the
    parent and the stage end Cancelled within seconds, no later stage starts, and the stage's record
    stays ``started`` so a re-run resumes it."""
    monkeypatch.chdir(tmp_path)
    training, inference, metrics = configs()
    if where == "placed train":
        training.update(slow=True, placement={"train": {"env": "local"}})
    elif where == "train here":
        training.update(slow=True)
    else:
        inference.update(slow=True)
    run = recipe_run(system=SlowSystem(training, inference, metrics))
    started = Path("infer_started") if where == "infer subflow" else Path("exp/train/pid.txt")
    canceller = cancel_when(started, where, "infer" if where == "infer subflow" else "recipe")
    state = run_flow(run)
    assert state.is_cancelled(), state
    assert time.monotonic() - canceller.cancelled_at[0] < 30
    stage = "infer" if where == "infer subflow" else "train"
    assert f"during {stage}; finished stages stay done, a re-run resumes" in state.message
    states = {row.stage: row.state for row in run.rows}
    assert states == {
        "create_dataset": "Completed",
        "train": "Completed",
        "infer": "Cancelled",
        "measure": "Not run",
    } | ({"train": "Cancelled", "infer": "Not run"} if stage == "train" else {})
    tasks = children(state.state_details.flow_run_id, {"create_dataset"})
    if where == "placed train":
        pid = int(Path("exp/train/pid.txt").read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # the job's process is gone
        said = logs_of(state.state_details.flow_run_id)  # the job's output, under the stage's task run
        assert (f"toy train runs in process {pid}", tasks["train"][2]) in said, said
    assert tasks["create_dataset"][0] == "Completed"
    assert "measure" not in tasks
    if stage == "train":
        assert tasks["train"][0] == "Cancelled" and "infer" not in tasks
    assert (
        '"status": "started"'
        in Path(f"exp/train/{'' if stage == 'train' else 'inference/'}{stage}.stage.json").read_text()
    )
