"""Any runner as the Prefect flow ``run-runner`` on real LocalClusters and a real Prefect server:
``set_parallel`` + ``runner(indices)`` from a script, ``espnet3_prefect.run`` in-process and as a
subflow, explicit index lists, resume, failing items, killed workers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from espnet3_prefect import ConfigError, run, set_parallel
from espnet3_prefect.execution import process_parallel as parallel_config
from tests.conftest import ROOT
from tests.helpers.api_reads import artifacts_of
from tests.helpers.workloads import LengthsProvider, LogProvider, SquareRunner, batches, builds, forward_calls

pytestmark = pytest.mark.slow
LOCAL2 = {"env": "local", "n_workers": 2, "num_shards": 4}


@pytest.fixture(autouse=True)
def no_registered_parallel():
    parallel_config._reset()
    yield
    parallel_config._reset()


def _runs_of(flow_run_id):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(flow_run_id)
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        artifacts = artifacts_of(client, flow_run.id)
    return flow_run, tasks, artifacts


def _flow_runs_named(name):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))


SCRIPT = """
import json, os, sys
from pathlib import Path
from espnet3_prefect import BaseRunner, EnvironmentProvider, set_parallel

class ScriptProvider(EnvironmentProvider):          # defined in __main__: travels to workers by value
    def build_env_local(self):
        with open(self.config["log"], "a") as f:
            f.write(f"build {os.getpid()}\\n")
        return {"scale": self.config["scale"]}

class ScriptRunner(BaseRunner):
    @staticmethod
    def forward(idx, scale, **env):
        return [(i, scale * i) for i in idx]

    @staticmethod
    def open_writers(shard_dir, **env):
        return {"out": open(Path(shard_dir) / "part.txt", "w")}

    @staticmethod
    def write_record(writers, result, state, **env):
        writers["out"].writelines(f"{i} {v}\\n" for i, v in result)

    def merge(self, shard_dirs):
        text = "".join((d / "part.txt").read_text() for d in shard_dirs)
        (self.output_dir / "all.txt").write_text(text)
        return {"lines": text.count("\\n")}

if __name__ == "__main__":  # local workers are spawned processes that re-import this script
    out, parallel = Path(sys.argv[1]), json.loads(sys.argv[2])
    if parallel is not None:
        set_parallel(parallel)
    runner = ScriptRunner(ScriptProvider({"log": str(out) + ".log", "scale": 3}), batch_size=4, output_dir=out)
    print("RESULT", json.dumps(runner(range(50))))
"""


def _script(tmp_path, out, parallel):
    path = tmp_path / "prep.py"
    path.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(path), str(out), json.dumps(parallel)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])


def test_script_set_parallel_then_runner_call_is_a_flow_run_on_a_local_cluster(prefect_server, tmp_path):
    assert _script(tmp_path, tmp_path / "local", None) == {"lines": 50}  # no parallel block: in-process
    assert _script(tmp_path, tmp_path / "flow", {"env": "local", "n_workers": 2}) == {"lines": 50}
    expected = "".join(f"{i} {3 * i}\n" for i in range(50))
    assert (tmp_path / "local/all.txt").read_text() == (tmp_path / "flow/all.txt").read_text() == expected
    assert len(builds(tmp_path / "flow.log")) == 2  # once per worker, not per shard (13 shards)

    [flow_run] = [r for r in _flow_runs_named("ScriptRunner")]
    flow_run, tasks, artifacts = _runs_of(flow_run.id)
    assert flow_run.state.is_completed()
    names = {t.name for t in tasks}
    assert {"build-env-ScriptRunner", "merge-ScriptRunner"} <= names
    assert {f"run-shard-ScriptRunner-{i}" for i in range(13)} <= names  # 50 items in batches of 4
    assert all(t.state.is_completed() for t in tasks)
    assert {a.type for a in artifacts} >= {"table", "progress"}
    assert flow_run.parameters["job"]["items"] == 50 and flow_run.parameters["job"]["runner"] == "__main__.ScriptRunner"


def test_explicit_index_list_in_any_order_resumes_and_a_new_list_redoes(prefect_server, tmp_path):
    log = tmp_path / "log"
    runner = SquareRunner(LogProvider({"log": str(log)}), None, tmp_path / "out")
    order = [9, 2, 7, 7, 0, 5, 3]
    lines = run(runner, order, parallel=LOCAL2)
    assert lines == [f"{i} {i * i}" for i in order]  # the given order, duplicates kept
    assert sorted(forward_calls(log)) == sorted(order)
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    assert [s["items"] for s in manifest["shards"]] == [[9, 2], [7, 7], [0, 5], [3]]

    assert run(runner, order, parallel=LOCAL2) == lines  # resumed: nothing recomputed, no cluster
    assert len(forward_calls(log)) == len(order) and len(builds(log)) == 2

    (tmp_path / "out/split.2/done").unlink()
    assert run(runner, order, parallel=LOCAL2) == lines  # only that shard again
    assert sorted(forward_calls(log)[len(order) :]) == [0, 5]

    assert run(runner, [1, 2], parallel=LOCAL2) == ["1 1", "2 4"]  # another list: another plan, redone
    assert not (tmp_path / "out/split.2").exists()  # shards beyond the new plan are gone


def test_run_with_max_duration_on_a_cluster_resumes_the_local_shards_and_keeps_the_lists_order(
    prefect_server, tmp_path
):
    """``espnet3_prefect.run(..., max_duration=...)`` as a flow run: batches cut by length within each shard
    (lengths from the provider's dataset, built on the driver), the merge that of a run without it; the
    local path's shards are the flow's (the same plan and fingerprint)."""
    lengths = [3.0, 1.0, 5.0, 2.0, 2.0, 8.0, 1.0, 4.0, 1.0, 6.0, 2.0, 3.0]
    order = [11, 2, 9, 0, 5, 7, 3, 10, 1, 4, 6, 8]
    log = tmp_path / "log"
    provider = LengthsProvider({"log": str(log), "lengths": lengths})
    plain = run(SquareRunner(provider, 4, tmp_path / "plain"), order, parallel=LOCAL2)
    keyed = run(SquareRunner(provider, 4, tmp_path / "keyed"), order, parallel=LOCAL2, max_duration=8.0)
    assert keyed == plain
    assert (tmp_path / "keyed/out.txt").read_bytes() == (tmp_path / "plain/out.txt").read_bytes()
    ran = batches(log)[3:]  # after the plain run's three batches of 4
    assert sorted(i for b in ran for i in b) == sorted(order)
    assert all(max(lengths[i] for i in b) * len(b) <= 8.0 or len(b) == 1 for b in ran)
    calls = len(forward_calls(log))
    local_runner = SquareRunner(provider, 4, tmp_path / "keyed")
    local_runner.max_duration = 8.0
    assert local_runner(order) == plain and len(forward_calls(log)) == calls  # every shard reused


def test_local_and_flow_share_shards_and_output(prefect_server, tmp_path):
    log = tmp_path / "log"
    runner = SquareRunner(LogProvider({"log": str(log)}), 3, tmp_path / "out")
    local = runner(range(40))  # no parallel block: in this process
    calls = len(forward_calls(log))
    text = (tmp_path / "out/out.txt").read_bytes()
    set_parallel({"env": "local", "n_workers": 2})
    assert runner(range(40)) == local and len(forward_calls(log)) == calls  # the flow trusts the local shards
    assert (tmp_path / "out/out.txt").read_bytes() == text
    runner.provider.config["offset"] = 1  # the provider's config changes outputs: every shard again
    assert runner(range(40))[:2] == ["0 1", "1 2"]


def test_subflow_of_a_user_flow_chains_steps_in_one_run(prefect_server, tmp_path):
    from prefect import flow

    @flow(name="my-recipe")
    def recipe():
        prep = run(SquareRunner(LogProvider({}), None, tmp_path / "prep"), range(6), parallel=LOCAL2)
        again = run(SquareRunner(LogProvider({"offset": 100}), 2, tmp_path / "stats"), [5, 4], parallel=LOCAL2)
        return prep, again

    state = recipe(return_state=True)
    prep, again = state.result()
    assert prep == [f"{i} {i * i}" for i in range(6)] and again == ["5 125", "4 116"]
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterParentFlowRunId

    parent = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        children = client.read_flow_runs(
            flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[parent]))
        )
    assert sorted(c.name for c in children) == ["SquareRunner", "SquareRunner"]
    assert all(c.state.is_completed() for c in children)


def test_failing_item_names_its_index_and_leaves_its_shard_not_done(prefect_server, tmp_path):
    runner = SquareRunner(LogProvider({"fail_at": 6}), None, tmp_path / "out")
    with pytest.raises(Exception, match=r"item 6: ValueError: cannot square 6") as info:
        run(runner, range(8), parallel=LOCAL2, retries=0)
    assert "split.3 items [6, 8)" in str(info.value)
    assert not (tmp_path / "out/split.3/done").exists() and not (tmp_path / "out/out.txt").exists()
    runner.provider.config["fail_at"] = None
    assert len(run(runner, range(8), parallel=LOCAL2)) == 8


def test_worker_killed_mid_shard_completes_with_identical_output(prefect_server, tmp_path):
    flag = tmp_path / "killed"
    log = tmp_path / "log"
    clean = run(SquareRunner(LogProvider({}), None, tmp_path / "clean"), range(20), parallel=LOCAL2)
    runner = SquareRunner(LogProvider({"kill_once_at": 12, "flag": str(flag), "log": str(log)}), None, tmp_path / "out")
    assert run(runner, range(20), parallel=LOCAL2) == clean
    assert flag.exists()  # the worker did die mid-shard
    assert (tmp_path / "out/out.txt").read_bytes() == (tmp_path / "clean/out.txt").read_bytes()
    calls = forward_calls(log)
    assert calls.count(12) == 2 and calls.count(10) == 2 and calls.count(0) == 1  # only split.2 again


def test_bad_calls_fail_before_anything_starts(tmp_path):
    runner = SquareRunner(LogProvider({}), None, tmp_path / "out")
    with pytest.raises(ConfigError, match="parallel.env: unknown backend 'slrum'"):
        run(runner, range(3), parallel={"env": "slrum"})
    with pytest.raises(ConfigError, match="no indices"):
        run(runner, [], parallel=LOCAL2)
    with pytest.raises(ConfigError, match=r"indices\[1\] is 'x'"):
        run(runner, [0, "x"], parallel=LOCAL2)
    with pytest.raises(ConfigError, match="runner.on_error"):
        run(runner, range(3), parallel=LOCAL2, on_error="ignore")
    with pytest.raises(ConfigError, match="parallel.n_workers"):
        set_parallel({"env": "local", "n_workers": 0})
    assert not (tmp_path / "out").exists()


NOTEBOOK = """
from prefect import flow, get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId
from espnet3_prefect import BaseRunner, EnvironmentProvider, run

class Provider(EnvironmentProvider):      # notebook cells: classes in __main__, no __file__, no guard
    def build_env_local(self):
        return {"k": self.config["k"]}

class Cells(BaseRunner):
    @staticmethod
    def forward(idx, k, **env):
        return idx * k

    def merge(self, shard_dirs):
        return len(shard_dirs)

@flow(name="notebook-recipe")
def recipe():
    parallel = {"env": "local", "n_workers": 2, "num_shards": 3}
    return run(Cells(Provider({"k": 2}), None, "out"), range(10), parallel=parallel)

state = recipe(return_state=True)
print("RESULT", state.result())
with get_client(sync_client=True) as client:
    parent = FlowRunFilterParentFlowRunId(any_=[state.state_details.flow_run_id])
    for child in client.read_flow_runs(flow_run_filter=FlowRunFilter(parent_flow_run_id=parent)):
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[child.id])))
        print("CHILD", child.name, child.state.type.value, ",".join(sorted(t.name for t in tasks)))
"""


def test_notebook_code_in_a_user_flow_on_prefects_own_temporary_api(tmp_path):
    """No PREFECT_API_URL: the user's flow runs on Prefect's temporary server, and the workers of the
    run-runner subflow report to that same API (their task runs are listed there)."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        PYTHONPATH=str(ROOT),
        PREFECT_HOME=str(tmp_path / "prefect-home"),
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="300",
    )
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(NOTEBOOK)],
        capture_output=True,
        text=True,
        timeout=480,
        env=env,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "RESULT 3" in proc.stdout
    assert (
        "CHILD Cells COMPLETED build-env-Cells,merge-Cells,run-shard-Cells-0,run-shard-Cells-1,run-shard-Cells-2"
        in proc.stdout
    )
