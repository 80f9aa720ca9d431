"""The metrics and evaluate flows for real: a real Prefect server, real LocalClusters.

metrics: known errors (hand-computed) and empty hyps through the flow, ESPnet3's metrics.json
layout, alignments, a custom metric by ``_target_``, mismatched utt_ids failing on one line.
evaluate: history, model identity from a checkpoint file, answered-from-cache, trend artifact, PNG.
"""

from __future__ import annotations

import json
import struct
import zlib

import pytest

from tests.conftest import write_yaml
from tests.helpers.wordrecipe import expected_wer, word_config

pytestmark = pytest.mark.slow

WER_T = "espnet3.systems.asr.metrics.wer.WER"
CER_T = "espnet3.systems.asr.metrics.cer.CER"


def known_errors_dir(root):
    """Two test sets with errors counted by hand (see the comments)."""
    a = root / "inference" / "test_a"
    a.mkdir(parents=True)
    # u1: "a b c" -> "a x c": 1 S; u2: "d e f g" -> "": 4 D (empty hyp); u3: "h" -> "h i": 1 I
    # WER = 6 / 8 = 75.00; chars: "a b c"(5) "d e f g"(7) "h"(1) = 13; u1 1 S 4 C, u2 7 D, u3 1 C 2 I (" i") -> 10/13
    (a / "ref.scp").write_text("u1 a b c\nu2 d e f g\nu3 h\n")
    (a / "hyp.scp").write_text("u1 a x c\nu2 \nu3 h i\n")
    b = root / "inference" / "test_b"
    b.mkdir(parents=True)
    (b / "ref.scp").write_text("v1 12345\nv2 678\n")  # one digit wrong: WER 1/2, CER 1/8
    (b / "hyp.scp").write_text("v1 12945\nv2 678\n")
    (root / "inference" / ".prefect-cache").mkdir()  # hidden: not a test set
    return root / "inference"


def metrics_cfg(tmp_path, inference_dir, metrics=None, **extra):
    cfg = {"inference_dir": str(inference_dir),
           "metrics": metrics or [{"metric": {"_target_": WER_T, "ref_key": "ref", "hyp_key": "hyp"}},
                                  {"metric": {"_target_": CER_T}, "inputs": {"ref": "ref", "hyp": "hyp"}}]}
    cfg.update(extra)
    return write_yaml(tmp_path / "metrics.yaml", cfg)


def test_metrics_flow_known_errors_layout_alignments_and_artifact(prefect_server, tmp_path):
    from prefect import get_client
    from espnet3_prefect.flows.metrics import metrics

    out = known_errors_dir(tmp_path)
    state = metrics(config=[str(metrics_cfg(tmp_path, out))], return_state=True)
    results = state.result()
    on_disk = json.loads((out / "metrics.json").read_text())
    assert on_disk == results
    assert list(on_disk) == [WER_T, CER_T] and list(on_disk[WER_T]) == ["test_a", "test_b"]
    assert on_disk[WER_T]["test_a"] == {"WER": 75.0, "WER_errors": 6, "WER_ref_len": 8, "WER_sub": 1,
                                        "WER_del": 4, "WER_ins": 1, "WER_hit": 3}
    assert on_disk[CER_T]["test_a"] == {"CER": 76.92, "CER_errors": 10, "CER_ref_len": 13, "CER_sub": 1,
                                        "CER_del": 7, "CER_ins": 2, "CER_hit": 5}
    assert on_disk[WER_T]["test_b"]["WER"] == 50.0 and on_disk[CER_T]["test_b"]["CER"] == 12.5
    assert "u2 S=0 D=4 I=0 C=0" in (out / "test_a" / "wer_alignment.txt").read_text()
    assert (out / "test_b" / "cer_alignment.txt").is_file()
    with get_client(sync_client=True) as client:
        artifacts = [a for a in client.read_artifacts() if a.flow_run_id == state.state_details.flow_run_id]
    [table] = [a for a in artifacts if a.type == "table"]
    assert table.key == "metrics-scores" and "75.0" in str(table.data) and "test_b" in str(table.data)


def test_custom_metrics_by_target_list_inputs_and_listed_test_sets(prefect_server, tmp_path):
    from espnet3_prefect.flows.metrics import metrics

    out = known_errors_dir(tmp_path)
    cfg = metrics_cfg(tmp_path, out, metrics=[
        {"metric": {"_target_": "tests.helpers.wordrecipe.UttCount", "field": "hyp"}, "inputs": ["hyp"]},
        {"metric": {"_target_": "tests.helpers.wordrecipe.ExactMatch"}},
    ], dataset={"test": [{"name": "test_a"}]})
    results = metrics(config=[str(cfg)])
    assert results == {"tests.helpers.wordrecipe.UttCount": {"test_a": {"UTTS": 3, "empty": 1}},
                       "tests.helpers.wordrecipe.ExactMatch": {"test_a": {"exact": 0.0, "first_ref": "a b c"}}}


def test_mismatched_utt_ids_fail_the_run_on_one_line_and_write_no_metrics_json(prefect_server, tmp_path):
    from espnet3_prefect.flows.metrics import metrics

    out = known_errors_dir(tmp_path)
    (out / "test_b" / "hyp.scp").write_text("v2 678\nv1 12945\n")
    with pytest.raises(Exception) as err:
        metrics(config=[str(metrics_cfg(tmp_path, out))])
    message = str(err.value)
    assert "hyp.scp line 1: utt_id 'v2' where" in message and "has 'v1'" in message and "\n" not in message
    assert not (out / "metrics.json").exists()


def _png_ok(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, size = 8, None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        assert struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0] == zlib.crc32(kind + body)
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        if kind == b"IDAT":
            w, h = size
            assert len(zlib.decompress(body)) == h * (1 + 3 * w)
        pos += 12 + length
    return size


def test_evaluate_history_cache_and_a_new_checkpoint(prefect_server, tmp_path):
    from prefect import get_client
    from espnet3_prefect.flows.evaluate import evaluate

    ckpt = tmp_path / "model.ckpt"
    ckpt.write_text("0\n")
    icfg = write_yaml(tmp_path / "inference.yaml", word_config(tmp_path, n=25, checkpoint=ckpt))
    mcfg = write_yaml(tmp_path / "metrics.yaml", {"metrics": [{"metric": {"_target_": WER_T}}]})
    args = {"infer_config": [str(icfg)], "metrics_config": [str(mcfg)]}

    first = evaluate(**args)
    assert first["status"].startswith("first evaluation: infer ran 3 of 3 shards")
    assert first["model"]["kind"] == "files" and first["model"]["files"][0]["path"] == str(ckpt)
    assert first["headline"] == {"WER": {"dev": 0.0}}

    again = evaluate(**args)  # what a nightly run with no new model sees
    assert again["answered_from_cache"] and again["shards_run"] == 0 and again["shards_cached"] == 3
    assert again["status"].startswith("answered from cache: model and config unchanged since")

    ckpt.write_text("3\n")  # a new checkpoint at the same path: every shard re-runs
    changed = evaluate(**args)
    assert changed["model_changed"] and changed["shards_run"] == 3 and not changed["answered_from_cache"]
    assert changed["headline"]["WER"]["dev"] == expected_wer(25, 3) > 0

    ckpt.write_text("3\n")  # rewritten, same bytes (new mtime): same model, answered from cache
    same = evaluate(**args)
    assert same["answered_from_cache"] and same["model"]["id"] == changed["model"]["id"]

    out = tmp_path / "inference"
    lines = (out / "evaluate_history.jsonl").read_text().splitlines()
    assert [json.loads(line)["answered_from_cache"] for line in lines] == [False, True, False, True]
    assert json.loads((out / "metrics.json").read_text())[WER_T]["dev"]["WER"] == expected_wer(25, 3)
    assert _png_ok((out / "evaluate_history.png").read_bytes()) == (480, 240)
    with get_client(sync_client=True) as client:
        trend = [a for a in client.read_artifacts() if a.key == "evaluate-trend"]
    latest = max(trend, key=lambda a: a.created)
    assert "answered from cache" in latest.data and latest.data.count("\n| 20") == 4  # one row per run
    assert f"| {expected_wer(25, 3):.2f} (+{expected_wer(25, 3):.2f}) |" in latest.data
    assert "data:image/png;base64," in latest.data


def test_evaluate_rejects_a_different_inference_dir_before_running(prefect_server, tmp_path):
    from espnet3_prefect.errors import ConfigError
    from espnet3_prefect.flows.evaluate import evaluate

    (tmp_path / "model.ckpt").write_text("0\n")
    icfg = write_yaml(tmp_path / "inference.yaml", word_config(tmp_path))
    mcfg = metrics_cfg(tmp_path, tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="inference_dir: the metrics config reads .*elsewhere but infer writes"):
        evaluate(infer_config=[str(icfg)], metrics_config=[str(mcfg)])
    assert not (tmp_path / "inference" / "dev").exists()  # nothing ran
