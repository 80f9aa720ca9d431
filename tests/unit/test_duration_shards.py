"""Shards sized by time (``parallel.shard_duration``): the count comes from the lengths, each shard about
the target, never more shards than the flow run's cap (shared by its test sets), handed out longest
first; the plan stays contiguous ranges on batch boundaries; a bad or conflicting key is one line."""

from __future__ import annotations

import math
import random

import pytest

from espnet3_prefect import ConfigError, load_config
from espnet3_prefect.execution.spec import ParallelSpec
from espnet3_prefect.pipeline.plan import (
    MAX_SHARD_TASKS_PER_FLOW,
    duration_shard_count,
    longest_first,
    plan_shards,
    shard_cost,
)
from espnet3_prefect.pipeline.resume import plan_for
from espnet3_prefect.pipeline.sizing import size_on_driver
from espnet3_prefect.pipeline.stage import build_stages
from tests.conftest import toy_config, write_yaml


def lognormal(n: int, seed: int = 11) -> list[float]:
    rng = random.Random(seed)
    return [round(rng.lognormvariate(0.5, 0.8), 3) for _ in range(n)]


def _stages(tmp_path, cfg):
    return build_stages(load_config([write_yaml(tmp_path / "inference.yaml", cfg)]))[1]


def _plan(stage):
    sizing = size_on_driver(stage)
    return plan_for(stage.with_dataset(sizing.dataset_id, sizing.lengths_id), sizing.n_items, sizing.lengths)


@pytest.mark.parametrize("batch_size", [None, 4])
def test_shards_are_about_the_target_contiguous_and_on_batch_boundaries(batch_size):
    lengths = lognormal(10_000)
    target = 120.0
    count = duration_shard_count(lengths, batch_size, target, MAX_SHARD_TASKS_PER_FLOW)
    assert count == math.ceil(sum(lengths) / target) and count > 100  # many more shards than workers
    shards = plan_shards("t", 10_000, count, batch_size, lengths=lengths)
    assert shards[0].start == 0 and shards[-1].stop == 10_000
    assert all(a.stop == b.start for a, b in zip(shards, shards[1:]))
    step = batch_size or 1
    assert all(s.start % step == 0 and s.stop > s.start for s in shards)
    biggest_unit = max(sum(lengths[i : i + step]) for i in range(0, 10_000, step))
    assert all(sum(lengths[s.start : s.stop]) <= target + biggest_unit for s in shards)
    # the forward calls are still upstream's consecutive batches
    whole = plan_shards("t", 10_000, 1, batch_size)
    assert [u for s in shards for u in s.units()] == [u for s in whole for u in s.units()]


def test_an_utterance_longer_than_the_target_is_a_shard_of_its_own_and_goes_first():
    lengths = [1.0] * 30
    lengths[17] = 50.0
    count = duration_shard_count(lengths, None, 5.0, MAX_SHARD_TASKS_PER_FLOW)
    shards = plan_shards("t", 30, count, lengths=lengths)
    own = next(s for s in shards if s.start <= 17 < s.stop)
    assert (own.start, own.stop) == (17, 18)
    order = longest_first(shards)
    assert order[0] is own
    costs = [shard_cost(s) for s in order]
    assert costs == sorted(costs, reverse=True)
    assert sorted(s.index for s in order) == list(range(len(shards)))


def test_longest_first_orders_by_padded_length_not_by_items():
    # batch_size 2: [1, 9] pads to 18, [5, 5] to 10 though both hold 10 s of audio
    import numpy as np

    f8 = lambda *v: np.array(v, dtype="<f8").tobytes()  # noqa: E731
    from espnet3_prefect.pipeline.plan import Shard

    even, padded = Shard("t", 0, 0, 2, 2, lengths=f8(5, 5)), Shard("t", 1, 2, 4, 2, lengths=f8(1, 9))
    assert [s.index for s in longest_first([even, padded])] == [1, 0]


def test_the_cap_merges_neighbouring_pieces_and_is_shared_by_the_test_sets(tmp_path):
    assert duration_shard_count(lognormal(3000), None, 0.001, MAX_SHARD_TASKS_PER_FLOW) == MAX_SHARD_TASKS_PER_FLOW
    lengths = lognormal(300, seed=2)  # a 300-item test set, 4 of them: 250 shards each, not 300
    cfg = toy_config(tmp_path, n=300)
    cfg["dataset"]["test"] = [{"name": f"t{k}", "n": 300, "lengths": lengths} for k in range(4)]
    cfg["parallel"] = {"env": "local", "n_workers": 2, "shard_duration": 0.001}
    stages = _stages(tmp_path, cfg)
    plans = [_plan(stage) for stage in stages]
    assert [len(p) for p in plans] == [MAX_SHARD_TASKS_PER_FLOW // 4] * 4  # 1000 task runs for the flow run
    for shards in plans:
        assert shards[0].start == 0 and shards[-1].stop == 300
        assert all(a.stop == b.start for a, b in zip(shards, shards[1:]))


def test_the_plan_is_the_same_for_any_worker_count_and_changes_with_the_target(tmp_path):
    lengths = lognormal(200, seed=5)
    plans = {}
    for workers, target in ((1, 30), (2, 30), (8, 30), (2, 60)):
        cfg = toy_config(tmp_path, n=200, n_workers=workers)
        cfg["dataset"]["test"][0]["lengths"] = lengths
        cfg["parallel"] = {"env": "local", "n_workers": workers, "shard_duration": target}
        plans[workers, target] = _plan(_stages(tmp_path, cfg)[0])
    assert plans[1, 30] == plans[2, 30] == plans[8, 30]
    assert len(plans[2, 30]) == math.ceil(sum(lengths) / 30)
    assert len(plans[2, 60]) == math.ceil(sum(lengths) / 60)


@pytest.mark.parametrize(
    ("block", "says"),
    [
        ({"shard_duration": 0}, "parallel.shard_duration: must be a finite number > 0"),
        ({"shard_duration": "10m"}, "parallel.shard_duration: must be a finite number > 0"),
        ({"shard_duration": True}, "parallel.shard_duration: must be a finite number > 0"),
        ({"shard_duration": float("nan")}, "parallel.shard_duration: must be a finite number > 0"),
        ({"shard_duration": 60, "num_shards": 8}, "parallel.shard_duration: conflicts with parallel.num_shards"),
    ],
)
def test_a_bad_shard_duration_is_one_line(block, says):
    with pytest.raises(ConfigError) as err:
        ParallelSpec.from_config({"env": "local", **block})
    assert str(err.value).startswith(says) and "\n" not in str(err.value)


def test_a_dataset_without_lengths_refuses_the_key_naming_the_test_set(tmp_path):
    cfg = toy_config(tmp_path, n=10)
    cfg["parallel"] = {"env": "local", "n_workers": 1, "shard_duration": 5}
    [stage] = _stages(tmp_path, cfg)
    with pytest.raises(ConfigError) as err:
        size_on_driver(stage)
    assert str(err.value).startswith(
        "parallel.shard_duration: test set 'test_a': its dataset (ToyDataset) has no lengths() to size shards by"
    )


def test_a_runner_job_refuses_the_key(tmp_path):
    from espnet3_prefect import BaseRunner
    from espnet3_prefect.pipeline.runner_job import prepare_job

    class Square(BaseRunner):
        @staticmethod
        def forward(batch, **env):
            return batch

    with pytest.raises(ConfigError, match=r"^parallel.shard_duration: \S*Square\(indices\) has no lengths\(\)"):
        prepare_job(Square(None, 2, str(tmp_path)), range(5), {"env": "local", "shard_duration": 3})
