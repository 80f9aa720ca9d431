"""Shards balanced on the dataset's lengths(): contiguous, on batch boundaries, deterministic, independent
of the worker count; changed lengths re-plan; a bad lengths() is one line; outputs are unchanged."""

from __future__ import annotations

import random

import pytest

from espnet3_prefect import BadInputError, load_config
from espnet3_prefect.disk.layout import StageLayout
from espnet3_prefect.pipeline.plan import default_num_shards, plan_shards
from espnet3_prefect.pipeline.resume import plan_for
from espnet3_prefect.pipeline.shard import process_shard
from espnet3_prefect.pipeline.sizing import dataset_lengths, size_on_driver
from espnet3_prefect.pipeline.stage import build_stages
from tests.conftest import toy_config, write_yaml


def lognormal(n: int, seed: int = 7) -> list[float]:
    rng = random.Random(seed)
    return [round(rng.lognormvariate(0.0, 1.0), 3) for _ in range(n)]


def _cost(shard, lengths):
    return sum(lengths[shard.start : shard.stop])


@pytest.mark.parametrize("batch_size", [None, 1, 4, 7])
def test_balanced_plan_is_contiguous_on_batch_boundaries_and_even_in_length(batch_size):
    lengths = sorted(lognormal(1000))  # sorted by length, as test sets often are for batching
    count = default_num_shards(1000, 2, batch_size)
    shards = plan_shards("t", 1000, count, batch_size, lengths=lengths)
    equal = plan_shards("t", 1000, count, batch_size)
    assert len(shards) == len(equal) == count
    assert shards[0].start == 0 and shards[-1].stop == 1000
    assert all(a.stop == b.start for a, b in zip(shards, shards[1:]))
    step = batch_size or 1
    assert all(s.start % step == 0 and s.stop > s.start for s in shards)
    # every model call still sees the batch upstream would give it
    assert [u for s in shards for u in s.units()] == [u for s in equal for u in s.units()]
    total, biggest_unit = sum(lengths), max(sum(lengths[i : i + step]) for i in range(0, 1000, step))
    costs = [_cost(s, lengths) for s in shards]
    assert max(costs) <= total / count + biggest_unit
    assert max(costs) < max(_cost(s, lengths) for s in equal) / 2  # equal counts: the long tail


def test_balanced_plan_is_deterministic_and_independent_of_workers():
    lengths = lognormal(5000, seed=3)
    plans = [plan_shards("t", 5000, default_num_shards(5000, w), 8, lengths=lengths) for w in (1, 2, 4, 16)]
    assert all(p == plans[0] for p in plans)
    assert plan_shards("t", 5000, 32, 8, lengths=list(lengths)) == plans[0]
    changed = list(lengths)
    changed[10] *= 50
    assert plan_shards("t", 5000, 32, 8, lengths=changed) != plans[0]


def test_zero_lengths_plan_by_counts_and_a_huge_item_gets_its_own_shard():
    assert plan_shards("t", 9, 3, lengths=[0] * 9) == plan_shards("t", 9, 3)
    shards = plan_shards("t", 8, 3, lengths=[1, 1, 1, 100, 1, 1, 1, 1])
    assert [(s.start, s.stop) for s in shards] == [(0, 3), (3, 4), (4, 8)]
    assert [(s.start, s.stop) for s in plan_shards("t", 4, 4, lengths=[0, 0, 0, 5])] == [
        (0, 1),
        (1, 2),
        (2, 3),
        (3, 4),
    ]  # never an empty shard


class WithLengths:
    def __init__(self, lengths, n=None):
        self._lengths, self.n = lengths, len(lengths) if n is None else n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"utt_id": f"u{i}", "x": i}

    def lengths(self):
        if isinstance(self._lengths, Exception):
            raise self._lengths
        return self._lengths


@pytest.mark.parametrize(
    "lengths, n, message",
    [
        ([1.0, 2.0], 3, "test set 't': WithLengths.lengths(): returned 2 values for 3 items"),
        ([[1, 2], [3, 4]], 2, "returned an array of shape (2, 2) values for 2 items"),
        ([1.0, -0.5, 2.0], 3, "WithLengths.lengths()[1] is -0.5: lengths must be finite numbers >= 0"),
        ([1.0, float("nan")], 2, "WithLengths.lengths()[1] is nan: lengths must be finite numbers >= 0"),
        ([1.0, "2.5", 3.0], 3, "WithLengths.lengths()[1] is '2.5' (str): lengths must be numbers"),
        ([1.0, None], 2, "WithLengths.lengths()[1] is None (NoneType): lengths must be numbers"),
        ([True, False], 2, "WithLengths.lengths()[0] is True (bool): lengths must be numbers"),
        ("12", 2, "must return a sequence with one number per item, got str"),
        (5, 1, "must return a sequence with one number per item, got int"),
        (OSError("utt2dur missing"), 2, "WithLengths.lengths() failed: OSError: utt2dur missing"),
    ],
)
def test_a_bad_lengths_is_one_line_naming_the_item(lengths, n, message):
    with pytest.raises(BadInputError) as err:
        dataset_lengths(WithLengths(lengths, n), n, "t")
    assert message in str(err.value) and "\n" not in str(err.value)


def test_lengths_that_are_not_the_protocol_are_ignored():
    class Attribute:
        lengths = [1, 2]

    class NeedsArguments:
        def lengths(self, column):
            return [1, 2]

    assert dataset_lengths(Attribute(), 2, "t") is None and dataset_lengths(NeedsArguments(), 2, "t") is None
    import numpy as np

    assert dataset_lengths(WithLengths(np.array([1, 2, 3], dtype=np.int32)), 3, "t").tolist() == [1.0, 2.0, 3.0]


def _stage(tmp_path, lengths, **kw):
    cfg = toy_config(tmp_path, n=len(lengths), num_shards=4, **kw)
    cfg["dataset"]["test"][0]["lengths"] = lengths
    [stage] = build_stages(load_config([write_yaml(tmp_path / "conf.yaml", cfg)]))[1]
    return stage


def test_lengths_join_the_stage_identity_and_plan_on_the_driver(tmp_path):
    lengths = [1.0] * 12 + [12.0, 12.0]
    stage = _stage(tmp_path, lengths)
    sizing = size_on_driver(stage)
    assert sizing.n_items == 14 and sizing.lengths.tolist() == lengths and sizing.lengths_id
    planned = stage.with_dataset(sizing.dataset_id, sizing.lengths_id)
    assert planned.work.identity["lengths"] == sizing.lengths_id
    assert planned.work.fingerprint != stage.work.fingerprint
    assert planned.identity_fingerprint == stage.identity_fingerprint  # same env on the workers
    # total 36, a quarter is 9: the two long items get a shard each
    assert [(s.start, s.stop) for s in plan_for(planned, 14, sizing.lengths)] == [(0, 9), (9, 12), (12, 13), (13, 14)]
    assert [(s.start, s.stop) for s in plan_for(stage, 14)] == [(0, 4), (4, 8), (8, 11), (11, 14)]
    other = size_on_driver(_stage(tmp_path / "b", lengths[:-1] + [11.0]))
    assert other.lengths_id != sizing.lengths_id


def test_outputs_are_identical_with_balanced_and_equal_shards(tmp_path):
    from espnet3_prefect.disk.concat import concat_files

    lengths = sorted(lognormal(30))
    stage = _stage(tmp_path, lengths, batch_size=2)
    env = stage.runner.provider.build_env_local()
    outputs = []
    for label, plan in (
        ("equal", plan_shards("test_a", 30, 4, 2)),
        ("balanced", plan_shards("test_a", 30, 4, 2, lengths=lengths)),
    ):
        layout = StageLayout(tmp_path / label / "test_a")
        for shard in plan:
            process_shard(stage.work.runner_cls, shard, {**env, "output_dir": str(layout.output_dir)}, layout)
        concat_files([layout.shard_dir(s.index) / "y.scp" for s in plan], layout.output_dir / "y.scp")
        outputs.append((layout.output_dir / "y.scp").read_bytes())
    assert outputs[0] == outputs[1]
    assert outputs[0].decode().splitlines()[5] == f"utt00005 {3 * 25}"
