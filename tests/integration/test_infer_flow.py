"""The infer flow for real: a real Prefect server, real LocalClusters with 2 workers.

Asserts the properties users rely on: merged output byte-identical for any worker count, batch
size and shard plan; resume executes nothing; a deleted marker re-runs exactly that shard; the env
is built once per worker; bad input fails with a message naming the utterance.
"""

from __future__ import annotations

import collections

import pytest

from tests.conftest import toy_config, write_yaml
from tests.helpers.api_reads import artifacts_of
from tests.helpers.toy import read_lines

pytestmark = pytest.mark.slow


def run_infer(tmp_path, cfg: dict, overrides=(), name="inference.yaml", **options):
    from espnet3_prefect.flows.infer import infer

    path = write_yaml(tmp_path / name, cfg)
    return infer(config=[str(path)], overrides=list(overrides), **options)


def forward_calls(tmp_path) -> list[tuple[int, int]]:
    return [tuple(map(int, line.split())) for line in read_lines(tmp_path / "forward.log")]


def test_merge_is_byte_identical_for_any_workers_batch_and_plan(prefect_server, tmp_path):
    outputs = []
    for i, (n_workers, batch_size, num_shards) in enumerate([(1, None, 1), (2, 4, 5), (2, 3, 7)]):
        run_dir = tmp_path / f"run{i}"
        cfg = toy_config(run_dir, n=23, n_workers=n_workers, batch_size=batch_size, num_shards=num_shards)
        [summary] = run_infer(run_dir, cfg)
        assert summary["shards"] == num_shards and summary["items"] == 23
        out = run_dir / "inference" / "test_a"
        outputs.append(((out / "y.scp").read_bytes(), (out / "ref.scp").read_bytes()))
    assert outputs[0] == outputs[1] == outputs[2]
    y_lines = outputs[0][0].decode().splitlines()
    assert y_lines == [f"utt{i:05d} {3 * i * i}" for i in range(23)]  # dataset order, right values


def test_resume_runs_nothing_and_a_deleted_marker_reruns_only_its_shard(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=20, num_shards=4)
    [first] = run_infer(tmp_path, cfg)
    merged = (tmp_path / "inference/test_a/y.scp").read_bytes()
    assert first["shards_run"] == 4 and first["shards_cached"] == 0
    assert sorted(i for _, i in forward_calls(tmp_path)) == list(range(20))

    (tmp_path / "forward.log").unlink()
    [again] = run_infer(tmp_path, cfg)
    assert again["shards_run"] == 0 and again["shards_cached"] == 4
    assert forward_calls(tmp_path) == []  # zero forward() calls on a finished stage

    (tmp_path / "inference/test_a/split.2/done").unlink()
    state = run_infer(tmp_path, cfg, return_state=True)
    [third] = state.result()
    assert third["shards_run"] == 1 and third["shards_cached"] == 3
    assert sorted(i for _, i in forward_calls(tmp_path)) == list(range(10, 15))  # shard 2 = [10, 15)
    assert (tmp_path / "inference/test_a/y.scp").read_bytes() == merged
    # the done markers are the one truth: the finished shards were never submitted, no result cache kept
    assert shard_task_runs(state.state_details.flow_run_id) == ["run-shard-test_a-2"]
    assert not (tmp_path / "inference/.prefect-cache").exists()


def shard_task_runs(flow_run_id) -> list[str]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sorted(r.name for r in runs if r.name.startswith("run-shard-"))


def test_resume_false_reruns_every_shard(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=12, num_shards=3)
    run_infer(tmp_path, cfg)
    [again] = run_infer(tmp_path, cfg, overrides=["runner.resume=false"])
    assert again["shards_run"] == 3 and again["shards_cached"] == 0


def test_changed_config_redoes_shards_and_outputs_follow(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=10, num_shards=2)
    run_infer(tmp_path, cfg)
    [changed] = run_infer(tmp_path, cfg, overrides=["model.scale=5"])
    assert changed["shards_run"] == 2
    assert (tmp_path / "inference/test_a/y.scp").read_text().splitlines()[3] == "utt00003 45"


def test_more_workers_on_resume_reuses_every_shard(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=16, n_workers=1, num_shards=4)
    run_infer(tmp_path, cfg)
    [again] = run_infer(tmp_path, cfg, overrides=["parallel.n_workers=2"])
    assert again["shards_run"] == 0 and again["shards_cached"] == 4


def test_env_is_built_once_per_worker(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=30, n_workers=2, num_shards=10)
    [summary] = run_infer(tmp_path, cfg)
    builds = collections.Counter(line.split()[1] for line in read_lines(tmp_path / "builds.log"))
    assert summary["workers"] == 2
    assert len(builds) == 2 and set(builds.values()) == {1}, builds  # two workers, one build each
    worker_pids = {str(pid) for pid, _ in forward_calls(tmp_path)}
    assert worker_pids <= set(builds)  # every forward ran on a worker that built once


@pytest.mark.parametrize(
    "bad, expected",
    [
        ({3: "no_input"}, "item 3 (utt_id='utt00003'): dataset item has no input_key 'x'"),
        ({4: "space_id"}, "utt_id 'utt 4': must be a plain token (no whitespace"),
    ],
)
def test_bad_items_fail_naming_the_utterance_and_publish_nothing_for_that_shard(
    prefect_server, tmp_path, bad, expected
):
    cfg = toy_config(tmp_path, n=10, num_shards=2, bad=bad)
    with pytest.raises(Exception) as err:
        run_infer(tmp_path, cfg)
    assert expected in str(err.value) and "split.0 items [0, 5)" in str(err.value)
    out = tmp_path / "inference/test_a"
    assert not (out / "split.0/done").exists() and not (out / "split.0/lock").exists()  # never taken as done
    assert (out / "split.1/done").is_file()  # the good shard finished and stays done
    assert not (out / "y.scp").exists()  # no merged output from a failed stage


def test_forward_output_that_is_not_a_dict_is_rejected(prefect_server, tmp_path):
    cfg = toy_config(tmp_path, n=4, num_shards=1, output_fn="tests.helpers.toy.not_a_dict_output_fn")
    with pytest.raises(Exception, match="forward\\(\\) output must be a dict with 'utt_id', got int"):
        run_infer(tmp_path, cfg)


def test_task_runs_are_named_after_shards_and_artifacts_are_published(prefect_server, tmp_path):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from espnet3_prefect.flows.infer import infer

    cfg = write_yaml(tmp_path / "inference.yaml", toy_config(tmp_path, n=6, num_shards=3))
    state = infer(config=[str(cfg)], return_state=True)
    flow_run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        task_runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        mine = artifacts_of(client, flow_run_id)
    names = {t.name for t in task_runs}
    assert {
        "run-shard-test_a-0",
        "run-shard-test_a-1",
        "run-shard-test_a-2",
        "merge-test_a",
        "build-env-test_a",
    } <= names
    assert not any(n.startswith("write-done-marker") for n in names)  # each shard marks itself done
    assert {a.type for a in mine} >= {"table", "progress"}
    table = next(a for a in mine if a.key == "infer-summary")
    assert "shards_run" in str(table.data) and "items_per_s" in str(table.data)
    throughput = next(a for a in mine if a.key == "throughput-test-a")  # one row per worker
    assert throughput.type == "table" and "items_per_worker_s" in str(throughput.data)
    plot = next(a for a in mine if a.key == "throughput-test-a-plot")  # the workers' rates as bars
    assert plot.type == "markdown" and "data:image/png;base64," in plot.data and "items per worker-second" in plot.data
    # the flow ended only once the server held its 5 task runs, all finished; a sixth never comes
    from espnet3_prefect.execution.run_states import wait_until_recorded

    assert {t.state.type.value for t in task_runs} == {"COMPLETED"} and len(task_runs) == 5
    assert wait_until_recorded(flow_run_id, 5, timeout_s=0.5) is True
    assert wait_until_recorded(flow_run_id, 6, timeout_s=0.5) is False


def test_lengths_balance_the_plan_prefetch_keeps_outputs_and_timing_reaches_the_summary(prefect_server, tmp_path):
    """A dataset with lengths(): shards cut on cumulative length (same outputs as counted shards);
    prefetch on (default) and off give the same bytes; changed lengths re-plan and redo every shard;
    the summary says where the shards' time went."""
    import json

    [plain] = run_infer(
        tmp_path / "plain", toy_config(tmp_path / "plain", n=20, num_shards=4), overrides=["+runner.prefetch=0"]
    )
    expected = (tmp_path / "plain/inference/test_a/y.scp").read_bytes()
    assert plain["timing"]["load_s"] is None  # prefetch off: loading is inside forward
    cfg = toy_config(tmp_path, n=20, num_shards=4)
    cfg["dataset"]["test"][0]["lengths"] = [1.0] * 16 + [8.0] * 4  # total 48: a quarter is 12
    [first] = run_infer(tmp_path, cfg)
    out = tmp_path / "inference/test_a"
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(s["items"][0], s["items"][-1]) for s in manifest["shards"]] == [(0, 11), (12, 16), (17, 17), (18, 19)]
    assert (out / "y.scp").read_bytes() == expected
    timing = first["timing"]
    assert first["shards_run"] == 4 and timing["shards"] == 4 and timing["load_s"] is not None
    assert timing["busy_s"] > 0 and timing["wall_s"] > 0 and timing["forward_s"] > 0
    assert json.loads((out / "split.0/done").read_text())["timing"]["prefetch"] == 2

    [again] = run_infer(tmp_path, cfg)
    assert again["shards_run"] == 0
    cfg["dataset"]["test"][0]["lengths"] = [8.0] * 4 + [1.0] * 16
    [replanned] = run_infer(tmp_path, cfg)
    assert replanned["shards_run"] == 4 and (out / "y.scp").read_bytes() == expected
