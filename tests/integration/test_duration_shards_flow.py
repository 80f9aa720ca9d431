"""Shards sized by time (``parallel.shard_duration``) through the real flow: a real Prefect server and a
LocalCluster. The shards start longest first (by padded length), the merged files are byte-identical
to the default plan's, and with both keys (shards by time, batches by duration) too."""

from __future__ import annotations

import math

import numpy as np
import pytest

from espnet3_prefect.pipeline.plan import Shard, longest_first, plan_shards
from tests.conftest import toy_config, write_yaml
from tests.helpers.toy import read_lines

pytestmark = pytest.mark.slow

# 24 items, batch_size 2: a long utterance in the middle, a few long ones at the end
LENGTHS = [1.0, 2.0, 1.0, 1.5, 2.0, 1.0, 1.0, 12.0, 1.0, 2.0, 1.0, 1.0]
LENGTHS += [1.0, 1.0, 2.0, 1.0, 3.0, 1.0, 1.0, 1.0, 6.0, 5.0, 4.0, 6.0]


def _config(tmp_path, n_workers: int, parallel: dict):
    cfg = toy_config(tmp_path, n=len(LENGTHS), n_workers=n_workers, batch_size=2)
    cfg["dataset"]["test"][0]["lengths"] = LENGTHS
    cfg["runner"]["_target_"] = "tests.helpers.toy.BatchLogRunner"
    cfg["provider"]["params"]["batch_log"] = str(tmp_path / "batches.log")
    cfg["parallel"] = {"env": "local", "n_workers": n_workers, **parallel}
    return cfg


def _run(tmp_path, cfg, overrides=()):
    from espnet3_prefect.flows.infer import infer

    [summary] = infer(config=[str(write_yaml(tmp_path / "inference.yaml", cfg))], overrides=list(overrides))
    return summary


def _merged(tmp_path) -> dict[str, bytes]:
    out = tmp_path / "inference/test_a"
    return {name: (out / name).read_bytes() for name in ("y.scp", "ref.scp")}


def test_time_sized_shards_start_longest_first_and_merge_as_the_default_plan(prefect_server, tmp_path):
    default = _run(tmp_path / "default", _config(tmp_path / "default", 2, {}))
    assert default["shards"] == 12  # one batch of 2 per shard at most: the default plan

    target = 8.0
    timed_dir = tmp_path / "timed"
    timed = _run(timed_dir, _config(timed_dir, 1, {"shard_duration": target}))
    count = math.ceil(sum(LENGTHS) / target)
    assert timed["shards"] == timed["shards_run"] == count
    assert _merged(timed_dir) == _merged(tmp_path / "default")
    lines = _merged(timed_dir)["y.scp"].decode().splitlines()
    assert len(lines) == len(set(lines)) == len(LENGTHS)

    # One worker: the shards ran one after another, in the order they were handed out.
    shards = plan_shards("test_a", len(LENGTHS), count, 2, lengths=LENGTHS)
    expected = longest_first(shards)
    shard_of = {i: s.index for s in shards for i in range(s.start, s.stop)}
    started = [shard_of[int(line.split()[0])] for line in read_lines(timed_dir / "batches.log")]
    started = [s for k, s in enumerate(started) if k == 0 or started[k - 1] != s]
    assert started == [s.index for s in expected], (started, [(s.index, s.start, s.stop) for s in expected])
    assert expected[0].start <= 7 < expected[0].stop  # the 12-s utterance's shard first


def test_time_sized_shards_with_duration_batches_on_two_workers_keep_the_merged_files(prefect_server, tmp_path):
    plain = tmp_path / "plain"
    _run(plain, _config(plain, 2, {"num_shards": 3}))
    both = tmp_path / "both"
    summary = _run(both, _config(both, 2, {"shard_duration": 6.0}), ["+runner.max_duration=6"])
    assert summary["shards"] == math.ceil(sum(LENGTHS) / 6.0) and summary["failed"] == 0
    assert _merged(both) == _merged(plain)
    forward = [list(map(int, line.split())) for line in read_lines(both / "batches.log")]
    assert sorted(i for batch in forward for i in batch) == list(range(len(LENGTHS)))  # each item once


def test_shard_cost_is_the_padded_length_of_its_batches():
    shard = Shard("t", 0, 0, 4, 2, lengths=np.array([1, 9, 5, 5], dtype="<f8").tobytes())
    assert [list(u) for u in shard.units()] == [[0, 1], [2, 3]]
    from espnet3_prefect.pipeline.plan import shard_cost

    assert shard_cost(shard) == 9 * 2 + 5 * 2
