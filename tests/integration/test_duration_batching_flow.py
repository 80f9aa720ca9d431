"""Batches by duration (``runner.max_duration``) through the real flow: a real Prefect server and a
LocalCluster. The merged files are byte-identical to a run without the key (the whole test set sorted,
the merged lines put back in dataset order; or, for a runner with its own merge, each shard sorted),
``forward`` saw batches sorted by length within the budget, a shard redone alone merges the same
bytes, and turning the key off redoes every shard."""

from __future__ import annotations

import logging

import pytest

from tests.conftest import toy_config, write_yaml
from tests.helpers.toy import read_lines

pytestmark = pytest.mark.slow

LENGTHS = [3.0, 1.0, 5.0, 2.0, 2.0, 8.0, 1.0, 4.0, 1.0, 6.0, 2.0, 3.0, 7.0, 0.5, 2.5, 1.5, 9.0, 1.0, 2.0, 4.0]


def _config(tmp_path, runner="BatchLogRunner", **extra):
    cfg = toy_config(tmp_path, n=len(LENGTHS), num_shards=3, batch_size=4, **extra)
    cfg["dataset"]["test"][0]["lengths"] = LENGTHS
    cfg["runner"]["_target_"] = f"tests.helpers.toy.{runner}"
    cfg["provider"]["params"]["batch_log"] = str(tmp_path / "batches.log")
    return cfg


def _run(tmp_path, cfg, overrides=()):
    from espnet3_prefect.flows.infer import infer

    [summary] = infer(config=[str(write_yaml(tmp_path / "inference.yaml", cfg))], overrides=list(overrides))
    return summary


def _batches(tmp_path):
    return [list(map(int, line.split())) for line in read_lines(tmp_path / "batches.log")]


class _Said(logging.Handler):
    """The flow run logger's lines, whatever the console does with them (the flows' console filter,
    set by an earlier flow of the same process, keeps some off the terminal)."""

    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_duration_batches_keep_the_merged_files_and_toggling_the_key_redoes_the_shards(prefect_server, tmp_path):
    from espnet3_prefect.pipeline.duration import duration_batches, padding

    plain_dir, keyed_dir = tmp_path / "plain", tmp_path / "keyed"
    plain = _run(plain_dir, _config(plain_dir))
    out_plain, out_keyed = plain_dir / "inference/test_a", keyed_dir / "inference/test_a"
    assert plain["shards_run"] == 3 and plain["timing"]["padding"]["real"] == sum(LENGTHS)
    assert all(len(b) == 4 for b in _batches(plain_dir))  # upstream's consecutive batches (20 = 5 x 4)

    said, flow_runs = _Said(), logging.getLogger("prefect.flow_runs")
    flow_runs.addHandler(said)
    try:
        keyed = _run(keyed_dir, _config(keyed_dir), ["+runner.max_duration=6"])
    finally:
        flow_runs.removeHandler(said)
    assert keyed["shards_run"] == 3
    caveat = "runner.max_duration=6: batches are cut by length (sorted across the whole test set"
    assert sum(caveat in line for line in said.lines) == 1, said.lines  # once per run, not per shard
    for name in ("y.scp", "ref.scp"):
        assert (out_keyed / name).read_bytes() == (out_plain / name).read_bytes()
    batches = _batches(keyed_dir)
    whole = duration_batches(range(len(LENGTHS)), LENGTHS, 6.0, 4)  # the whole test set sorted, then cut
    assert sorted(batches) == sorted(whole)
    assert keyed["timing"]["padding"]["padded"] == padding(whole, dict(enumerate(LENGTHS)))["padded"]
    assert sorted(i for b in batches for i in b) == list(range(len(LENGTHS)))
    for batch in batches:
        assert len(batch) <= 4 and (max(LENGTHS[i] for i in batch) * len(batch) <= 6.0 or len(batch) == 1)
        assert [LENGTHS[i] for i in batch] == sorted((LENGTHS[i] for i in batch), reverse=True)
    padded = keyed["timing"]["padding"]
    assert padded["real"] == sum(LENGTHS) and padded["padded"] < plain["timing"]["padding"]["padded"]

    (out_keyed / "split.1" / "done").unlink()  # one shard lost: only it runs again, the merge is the same
    again = _run(keyed_dir, _config(keyed_dir), ["+runner.max_duration=6"])
    assert again["shards_run"] == 1 and again["shards_cached"] == 2
    for name in ("y.scp", "ref.scp"):
        assert (out_keyed / name).read_bytes() == (out_plain / name).read_bytes()
    batches = _batches(keyed_dir)

    off = _run(keyed_dir, _config(keyed_dir))  # the key turned off: no shard of the other mode is reused
    assert off["shards_run"] == 3 and off["shards_cached"] == 0
    assert (out_keyed / "y.scp").read_bytes() == (out_plain / "y.scp").read_bytes()
    assert all(len(b) == 4 for b in _batches(keyed_dir)[len(batches) :])


def test_length_order_with_skipped_items_and_a_runner_of_its_own_merge_keep_the_dataset_order(prefect_server, tmp_path):
    """Two items fail under ``on_error: skip`` (their lines are missing, the rest in dataset order), and a
    runner with its own ``merge`` is sorted within each shard instead, saying so."""
    bad = {5: "model_raise", 12: "model_raise"}
    control = {"on_error": "skip", "max_failed_ratio": 0.5}
    merged = {}
    for name, runner, overrides in (
        ("plain", "BatchLogRunner", []),
        ("keyed", "BatchLogRunner", ["+runner.max_duration=6"]),
        ("own_plain", "OwnMergeRunner", []),
        ("own_keyed", "OwnMergeRunner", ["+runner.max_duration=6"]),
    ):
        cfg = _config(tmp_path / name, runner, bad=bad)
        cfg["runner"].update(control)
        said, flow_runs = _Said(), logging.getLogger("prefect.flow_runs")
        flow_runs.addHandler(said)
        try:
            summary = _run(tmp_path / name, cfg, overrides)
        finally:
            flow_runs.removeHandler(said)
        assert summary["failed"] == 2
        merged[name] = (tmp_path / name / "inference/test_a/y.scp").read_bytes()
        if name == "own_keyed":
            assert any("(sorted within each shard, as the runner's own merge()" in line for line in said.lines)
            from espnet3_prefect.pipeline.plan import plan_shards

            shards = plan_shards("test_a", len(LENGTHS), 3, 4, lengths=LENGTHS)  # today's ranges
            shard_of = {i: s.index for s in shards for i in range(s.start, s.stop)}
            assert all(len({shard_of[i] for i in batch}) == 1 for batch in _batches(tmp_path / name))
    lines = merged["plain"].decode().splitlines()
    assert len(lines) == len(LENGTHS) - 2 and not any(line.startswith(("utt00005 ", "utt00012 ")) for line in lines)
    assert merged["keyed"] == merged["plain"] and merged["own_keyed"] == merged["own_plain"] == merged["plain"]
