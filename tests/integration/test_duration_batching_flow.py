"""Batches by duration (``runner.max_duration``) through the real flow: a real Prefect server and a
LocalCluster. The merged files are byte-identical to a run without the key, ``forward`` saw batches
sorted by length within the budget, and turning the key off redoes every shard."""

from __future__ import annotations

import logging

import pytest

from tests.conftest import toy_config, write_yaml
from tests.helpers.toy import read_lines

pytestmark = pytest.mark.slow

LENGTHS = [3.0, 1.0, 5.0, 2.0, 2.0, 8.0, 1.0, 4.0, 1.0, 6.0, 2.0, 3.0, 7.0, 0.5, 2.5, 1.5, 9.0, 1.0, 2.0, 4.0]


def _config(tmp_path):
    cfg = toy_config(tmp_path, n=len(LENGTHS), num_shards=3, batch_size=4)
    cfg["dataset"]["test"][0]["lengths"] = LENGTHS
    cfg["runner"]["_target_"] = "tests.helpers.toy.BatchLogRunner"
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
    caveat = "runner.max_duration=6: batches are cut by length"
    assert sum(caveat in line for line in said.lines) == 1, said.lines  # once per run, not per shard
    for name in ("y.scp", "ref.scp"):
        assert (out_keyed / name).read_bytes() == (out_plain / name).read_bytes()
    batches = _batches(keyed_dir)
    assert sorted(i for b in batches for i in b) == list(range(len(LENGTHS)))
    for batch in batches:
        assert len(batch) <= 4 and (max(LENGTHS[i] for i in batch) * len(batch) <= 6.0 or len(batch) == 1)
        assert [LENGTHS[i] for i in batch] == sorted((LENGTHS[i] for i in batch), reverse=True)
    padded = keyed["timing"]["padding"]
    assert padded["real"] == sum(LENGTHS) and padded["padded"] < plain["timing"]["padding"]["padded"]

    off = _run(keyed_dir, _config(keyed_dir))  # the key turned off: no shard of the other mode is reused
    assert off["shards_run"] == 3 and off["shards_cached"] == 0
    assert (out_keyed / "y.scp").read_bytes() == (out_plain / "y.scp").read_bytes()
    assert all(len(b) == 4 for b in _batches(keyed_dir)[len(batches) :])
