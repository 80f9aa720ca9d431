"""A shard's counts as one record (pipeline/throughput.py's ShardStats), the padded length of a batch
(pipeline/duration.py's padded_length) and the GPU busy mean: the done marker and the summary keep the
keys and order the dicts had, a marker the earlier code wrote still reads as done, and every figure is
the one the formulas they replace gave."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace

import numpy as np
import pytest

from espnet3_prefect._internal.atomic import file_digest
from espnet3_prefect.disk.layout import StageLayout
from espnet3_prefect.disk.marker import check_marker, read_marker
from espnet3_prefect.pipeline.duration import duration_batches, padded_length, padding
from espnet3_prefect.pipeline.plan import Shard, balanced_cuts, plan_length_order, shard_cost
from espnet3_prefect.pipeline.shard import process_shard
from espnet3_prefect.pipeline.throughput import ShardStats, add_worker, figures, gpu_mean
from tests.unit.test_shard_loop import PlainRunner, _env

STATS_KEYS = ["items", "failed", "seconds", "host", "pid", "job_id"]


def test_the_marker_and_the_summary_keep_their_keys_and_order(tmp_path):
    layout = StageLayout(tmp_path / "test_a")
    shard = Shard("test_a", 0, 0, 5, batch_size=2)
    summary = process_shard(PlainRunner, shard, _env(layout.output_dir), layout, marker={"fingerprint": "f"})
    fields = [k for k in shard.to_dict() if k != "lengths"]
    assert list(summary) == [*fields, *STATS_KEYS, "timing"]
    marker = read_marker(layout.shard_dir(0))
    marked = [k for k in STATS_KEYS if k != "pid"]
    assert sorted(marker) == sorted(
        ["version", "fingerprint", "test_set", "index", "start", "stop", *marked, "timing", "files"]
    )
    counted, reported = ShardStats.from_dict(marker), ShardStats.from_dict(summary)
    assert (reported.items, reported.failed) == (5, 0) and reported.pid is not None
    assert counted == replace(reported, seconds=marker["seconds"], pid=None)
    assert pickle.loads(pickle.dumps(reported)) == reported  # as it would cross to a Dask worker


def test_a_marker_the_earlier_code_wrote_is_read_as_done(tmp_path):
    shard_dir = tmp_path / "split.0"
    shard_dir.mkdir()
    (shard_dir / "y.txt").write_text("u0 0\n")
    earlier = {  # the record the string-keyed code wrote, byte for byte
        "version": 2,
        "fingerprint": "f",
        "test_set": "t",
        "index": 0,
        "start": 0,
        "stop": 1,
        "items": 1,
        "failed": 0,
        "seconds": 0.0123,
        "host": "node1",
        "job_id": None,
        "timing": {"forward_s": 0.01},
        "files": {"y.txt": file_digest(shard_dir / "y.txt")},
    }
    (shard_dir / "done").write_text(json.dumps(earlier, sort_keys=True, indent=1) + "\n")
    assert check_marker(shard_dir, {"fingerprint": "f", "start": 0, "stop": 1}) is None
    stats = ShardStats.from_dict(read_marker(shard_dir))
    assert stats == ShardStats(1, 0, 0.0123, "node1", None) and stats.worker == "node1:?"
    assert {**earlier, **stats.to_dict()} == earlier  # the same keys and values written back


@pytest.mark.parametrize("seed", range(5))
def test_padded_lengths_are_the_longest_times_the_count_as_before(seed):
    rng = np.random.default_rng(seed)
    values = rng.uniform(0.1, 20.0, 200)
    for batch in duration_batches(range(200), values, 60.0, 8):
        assert padded_length(values[batch]) == float(values[batch].max()) * len(batch)
        as_floats = [float(values[i]) for i in batch]
        assert padded_length(as_floats) == max(as_floats) * len(as_floats)
    shard = Shard("t", 0, 0, 200, 8, lengths=values.astype("<f8").tobytes(), max_duration=60.0)
    expected = sum(max(values[i] for i in b) * len(b) for b in shard.forward_units())
    assert shard_cost(shard) == expected
    assert padding(shard.forward_units(), dict(enumerate(values.tolist())))["padded"] == round(expected, 6)
    batches = duration_batches(range(200), values, 60.0, 8)
    cuts = balanced_cuts([float(values[b].max()) * len(b) for b in batches], 4)
    runs = [tuple(i for b in batches[cuts[k] : cuts[k + 1]] for i in b) for k in range(4)]
    assert [s.indices for s in plan_length_order("t", values, 4, 8, 60.0)] == runs


def test_the_gpu_mean_is_the_weighted_mean_the_two_places_computed():
    parts = [(10, 0.5), (30, 0.9), (7, 0.1234)]
    busy_sum = 0.0
    for samples, busy in parts:
        busy_sum += busy * samples
    assert gpu_mean(parts) == (47, round(busy_sum / 47, 4))
    total = {}
    for samples, busy in parts:
        add_worker(
            total, {"host": "n", "pid": 1, "items": 1, "seconds": 1.0, "gpu_busy": {"samples": samples, "busy": busy}}
        )
    row = total["by_worker"]["n:1"]
    pairwise = round((round((10 * 0.5 + 30 * 0.9) / 40, 4) * 40 + 0.1234 * 7) / 47, 4)
    assert (row["gpu_samples"], row["gpu_busy"]) == (47, pairwise)
    assert figures(total, items_run=3, unit=None)["gpu_busy"] == pairwise
    assert gpu_mean([]) == (0, None)
