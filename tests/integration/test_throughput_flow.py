"""Lengths from audio headers and RTFx on every run, through the real flow (a real Prefect server, a
LocalCluster of 2 workers, real FSDD recordings through a torch model): without ``runner.max_duration``
each shard reads its items' headers for the report; with it the driver reads them (cached) and they cut
the batches, and the merged files stay byte-identical. Every run writes ``<test>/.throughput.json`` and
says RTFx in its closing summary."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import write_yaml

pytestmark = pytest.mark.slow

FIELDS = ("frames", "log_energy", "digit")


def _config(tmp_path, fsdd_dir, n=40):
    from tests.helpers.fsdd import fsdd_inference_config

    return fsdd_inference_config(tmp_path / "inf", fsdd_dir, limit=n, num_shards=4)


def _run(tmp_path, cfg, overrides=()):
    from espnet3_prefect.flows.infer import infer

    [summary] = infer(config=[str(write_yaml(tmp_path / "fsdd.yaml", cfg))], overrides=list(overrides))
    return summary


def test_rtfx_on_every_run_and_header_lengths_cut_batches_only_with_the_key(prefect_server, tmp_path, fsdd_dir):
    import soundfile as sf

    from espnet3_prefect.pipeline.report import format_summary

    paths = sorted(fsdd_dir.glob("*.wav"))[:40]
    seconds = sum(sf.info(p).frames / sf.info(p).samplerate for p in paths)

    plain_dir, keyed_dir = tmp_path / "plain", tmp_path / "keyed"
    plain = _run(plain_dir, _config(plain_dir, fsdd_dir))
    assert plain["lengths"] == {"source": "audio headers (read by each shard)", "unit": "s"}
    assert not (plain_dir / "inf/.lengths-cache").exists()  # without the key: nothing on the driver
    data = json.loads((plain_dir / "inf/fsdd/.throughput.json").read_text())
    assert data["test_set"] == "fsdd" and data["items_run"] == 40 and data["max_duration"] is None
    assert np.isclose(data["audio_s"], seconds, atol=1e-3) and data["rtfx"] > 0 and data["items_per_s"] > 0
    assert 0 < data["padding_efficiency"] < 1  # upstream's consecutive batches of 4 recordings of mixed length
    assert sum(w["items"] for w in data["workers"]) == 40 and all(w["rtfx_per_worker_s"] > 0 for w in data["workers"])
    assert data["gpu_busy"] is None  # no GPU here: nothing sampled, nothing claimed
    assert "RTFx" in format_summary([plain]) and "padding efficiency" in format_summary([plain])

    _run(keyed_dir, _config(keyed_dir, fsdd_dir), ["+runner.max_duration=2.5"])
    for field in FIELDS:
        assert (keyed_dir / f"inf/fsdd/{field}.scp").read_bytes() == (plain_dir / f"inf/fsdd/{field}.scp").read_bytes()
    keyed_data = json.loads((keyed_dir / "inf/fsdd/.throughput.json").read_text())
    assert keyed_data["max_duration"] == 2.5 and keyed_data["lengths_source"] == "audio headers"
    assert keyed_data["padding_efficiency"] > data["padding_efficiency"]  # sorted batches pad less
    assert np.isclose(keyed_data["audio_s"], seconds, atol=1e-3)

    again = _run(plain_dir, _config(plain_dir, fsdd_dir))  # nothing to run: the last run's figures stay
    assert again["shards_run"] == 0
    assert json.loads((plain_dir / "inf/fsdd/.throughput.json").read_text()) == data
