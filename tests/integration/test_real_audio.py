"""Real torch models on real audio: the DTMF demo (generated) and FSDD recordings (shared/)."""

from __future__ import annotations

import pytest

from dtmf_demo.recipe import prepare
from tests.conftest import ROOT, write_yaml

pytestmark = pytest.mark.slow


def run_infer(cfg_path, overrides):
    from espnet3_prefect.flows.infer import infer

    return infer(config=[str(cfg_path)], overrides=overrides)


def test_dtmf_demo_errs_only_where_impaired_and_matches_across_workers_and_batches(prefect_server, tmp_path):
    prepare(tmp_path / "data", scale=0.1)  # 30 clean + 20 noisy utterances, 1 of them impaired
    conf = ROOT / "recipes/dtmf/conf/inference.yaml"
    outs = []
    for i, extra in enumerate(
        [
            ["parallel.n_workers=1", "batch_size=null", "+parallel.num_shards=1"],
            ["parallel.n_workers=2", "batch_size=4", "+parallel.num_shards=6"],
        ]
    ):
        run_infer(conf, [f"exp_dir={tmp_path}", f"inference_dir={tmp_path}/inf{i}", *extra])
        outs.append({t: (tmp_path / f"inf{i}/{t}/hyp.scp").read_bytes() for t in ("test_clean", "test_noisy")})
    assert outs[0] == outs[1]
    for test_set in ("test_clean", "test_noisy"):
        hyp = dict(line.split(" ", 1) for line in (tmp_path / f"inf1/{test_set}/hyp.scp").read_text().splitlines())
        ref = dict(line.split(" ", 1) for line in (tmp_path / f"inf1/{test_set}/ref.scp").read_text().splitlines())
        impaired = tmp_path / "data" / test_set / "impairments"
        said = {u: h for u, _, h in (x.split() for x in impaired.read_text().splitlines())} if impaired.exists() else {}
        assert len(hyp) == len(ref) > 0 and list(hyp) == list(ref)
        assert {u: h for u, h in hyp.items() if h != ref[u]} == said  # the impaired utterance, as designed
    assert len(said) == 1  # test_noisy at scale 0.1


def test_fsdd_recordings_through_a_torch_model_identical_for_any_workers(prefect_server, tmp_path, fsdd_dir):
    cfg = {
        "inference_dir": str(tmp_path / "inf"),
        "dataset": {
            "_target_": "tests.helpers.fsdd.FsddOrganizer",
            "test": [{"name": "fsdd", "root": str(fsdd_dir), "limit": 60}],
        },
        "model": {"_target_": "tests.helpers.fsdd.LogEnergyModel"},
        "input_key": "speech",
        "output_fn": "tests.helpers.fsdd.fsdd_output_fn",
        "provider": {"_target_": "espnet3.systems.base.inference_provider.InferenceProvider"},
        "runner": {"_target_": "espnet3.systems.base.inference_runner.InferenceRunner"},
        "parallel": {"env": "local", "n_workers": 1, "num_shards": 1},
    }
    path = write_yaml(tmp_path / "fsdd.yaml", cfg)
    run_infer(path, [])
    one = {f: (tmp_path / f"inf/fsdd/{f}.scp").read_bytes() for f in ("frames", "log_energy", "digit")}
    run_infer(
        path, [f"inference_dir={tmp_path}/inf2", "parallel.n_workers=2", "parallel.num_shards=5", "+batch_size=7"]
    )
    two = {f: (tmp_path / f"inf2/fsdd/{f}.scp").read_bytes() for f in ("frames", "log_energy", "digit")}
    assert one == two
    frames = dict(line.split() for line in one["frames"].decode().splitlines())
    assert len(frames) == 60 and list(frames) == sorted(frames)
    from tests.helpers.fsdd import FsddDataset, LogEnergyModel

    first = FsddDataset(str(fsdd_dir), 1)[0]
    assert int(frames[first["utt_id"]]) == LogEnergyModel().features(first["speech"])[0]
