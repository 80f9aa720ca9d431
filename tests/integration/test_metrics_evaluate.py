"""The metrics and evaluate flows for real: a real Prefect server, real LocalClusters.

metrics: known errors (hand-computed) and empty hyps through the flow, ESPnet3's metrics.json
bytes, alignments, custom metrics by ``_target_``, ``dataset:`` inputs written once per test set,
mismatched utt_ids failing on one line.
evaluate: history, model identity from a checkpoint file, answered-from-cache, trend artifact, PNG.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import write_yaml
from tests.helpers.api_reads import artifacts_of, latest_artifact
from tests.helpers.wordrecipe import expected_wer, word_config

pytestmark = pytest.mark.slow

WER_T = "espnet3.systems.esp2_asr.metrics.wer.WER"
CER_T = "espnet3.systems.esp2_asr.metrics.cer.CER"
REF_HYP = {"ref": "ref", "hyp": "hyp"}


def known_errors_dir(root):
    """Two test sets with errors counted by hand (see the comments)."""
    a = root / "inference" / "test_a"
    a.mkdir(parents=True)
    # u1: "a b c" -> "a x c": 1 S; u2: "d e f g" -> "" (ESPnet3 scores it as "."): 1 S 3 D; u3: "h" -> "h i": 1 I
    # WER = 6 / 8 = 75.00; chars: "a b c"(5) "d e f g"(7) "h"(1) = 13; u1 1 S, u2 1 S 6 D, u3 2 I (" i") -> 10/13
    (a / "ref.scp").write_text("u1 a b c\nu2 d e f g\nu3 h\n")
    (a / "hyp.scp").write_text("u1 a x c\nu2 \nu3 h i\n")
    b = root / "inference" / "test_b"
    b.mkdir(parents=True)
    (b / "ref.scp").write_text("v1 12345\nv2 678\n")  # one digit wrong: WER 1/2, CER 1/8
    (b / "hyp.scp").write_text("v1 12945\nv2 678\n")
    (root / "inference" / ".prefect-cache").mkdir()  # hidden: not a test set
    return root / "inference"


def metrics_cfg(tmp_path, inference_dir, metrics=None, **extra):
    cfg = {
        "inference_dir": str(inference_dir),
        "metrics": metrics
        or [
            {"metric": {"_target_": WER_T, "clean_types": None}, "inputs": REF_HYP},
            {"metric": {"_target_": CER_T}, "inputs": ["ref", "hyp"]},
        ],
    }
    cfg.update(extra)
    return write_yaml(tmp_path / "metrics.yaml", cfg)


def test_metrics_flow_known_errors_layout_alignments_and_artifact(prefect_server, tmp_path):
    from prefect import get_client

    from espnet3_prefect.flows.metrics import metrics

    out = known_errors_dir(tmp_path)
    state = metrics(config=[str(metrics_cfg(tmp_path, out))], return_state=True)
    results = state.result()
    text = (out / "metrics.json").read_text(encoding="utf-8")
    assert text == json.dumps(results, indent=2, ensure_ascii=False)  # ESPnet3's bytes: no final newline
    assert results == {
        WER_T: {"test_a": {"WER": 75.0}, "test_b": {"WER": 50.0}},
        CER_T: {"test_a": {"CER": 76.92}, "test_b": {"CER": 12.5}},
    }
    assert list(results) == [WER_T, CER_T] and list(results[WER_T]) == ["test_a", "test_b"]
    alignment = (out / "test_a" / "wer_alignment").read_text()
    assert "=== SENTENCE 2 ===\n\nREF: d e f g\nHYP: . * * *\n     S D D D\n" in alignment
    assert alignment.endswith("\nWER: 75.00 (hits=3, substitutions=2, deletions=3, insertions=1)\n")
    assert (out / "test_b" / "cer_alignment").is_file()
    with get_client(sync_client=True) as client:
        artifacts = artifacts_of(client, state.state_details.flow_run_id)
    [table] = [a for a in artifacts if a.type == "table"]
    assert table.key == "metrics-scores" and "75.0" in str(table.data) and "test_b" in str(table.data)


def test_custom_metrics_by_target_list_inputs_and_listed_test_sets(prefect_server, tmp_path):
    from espnet3_prefect.flows.metrics import metrics

    out = known_errors_dir(tmp_path)
    cfg = metrics_cfg(
        tmp_path,
        out,
        metrics=[
            {"metric": {"_target_": "tests.helpers.wordrecipe.UttCount", "field": "hyp"}, "inputs": ["hyp"]},
            {"metric": {"_target_": "tests.helpers.wordrecipe.ExactMatch"}},
        ],
        dataset={"test": [{"name": "test_a"}]},
    )
    results = metrics(config=[str(cfg)])
    assert results == {
        "tests.helpers.wordrecipe.UttCount": {"test_a": {"UTTS": 3, "empty": 1}},
        "tests.helpers.wordrecipe.ExactMatch": {"test_a": {"exact": 0.0, "first_ref": "a b c"}},
    }


def test_mismatched_utt_ids_fail_the_run_on_one_line_and_write_no_metrics_json(prefect_server, tmp_path):
    from espnet3_prefect.flows.metrics import metrics

    out = known_errors_dir(tmp_path)
    (out / "test_b" / "hyp.scp").write_text("v2 678\nv1 12945\n")
    with pytest.raises(Exception) as err:
        metrics(config=[str(metrics_cfg(tmp_path, out))])
    message = str(err.value)
    assert "hyp.scp line 1: utt_id 'v2' where" in message and "has 'v1'" in message and "\n" not in message
    assert not (out / "metrics.json").exists()


def _task_run_names(flow_run_id) -> list[str]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return sorted(r.name for r in runs)


def test_dataset_inputs_are_written_once_per_test_set_and_reused(prefect_server, tmp_path):
    from espnet3_prefect.flows.metrics import metrics
    from tests.helpers.wordrecipe import WordDataset

    icfg = word_config(tmp_path, n=7)
    icfg["dataset"]["test"] = [{"name": "dev", "n": 7}, {"name": "eval", "n": 3}]
    ipath = write_yaml(tmp_path / "inference.yaml", icfg)
    out = tmp_path / "inference"
    for name, n in (("dev", 7), ("eval", 3)):  # what infer would write: hyps only, the second word dropped
        rows = [WordDataset(n)[i] for i in range(n)]
        (out / name).mkdir(parents=True)
        (out / name / "hyp.scp").write_text(
            "".join(f"{r['utt_id']} {' '.join(w for k, w in enumerate(r['text'].split()) if k != 1)}\n" for r in rows)
        )
    cfg = metrics_cfg(
        tmp_path,
        out,
        metrics=[
            {"metric": {"_target_": WER_T}, "inputs": {"ref": "dataset:text", "hyp": "hyp"}},
            {"metric": {"_target_": CER_T}, "inputs": {"ref": "dataset:text", "hyp": "hyp"}},
            {"metric": {"_target_": "tests.helpers.metrics_recipes.WordStats"}, "inputs": {"hyp": "hyp"}},
        ],
        dataset={"test": [{"name": "eval"}, {"name": "dev"}]},
    )
    state = metrics(config=[str(cfg)], inference_config=[str(ipath)], return_state=True)
    results = state.result()
    # dev: 7 sentences of 3, 4, 6, 1, 5, 3, 4 words, one dropped from each but "hello": 6 of 26
    assert results[WER_T] == {"eval": {"WER": round(100 * 3 / 13, 2)}, "dev": {"WER": round(100 * 6 / 26, 2)}}
    assert list(results) == [WER_T, CER_T, "tests.helpers.metrics_recipes.WordStats"]
    assert results["tests.helpers.metrics_recipes.WordStats"]["dev"]["hyp_words"] == 20
    text_scp = out / "dev" / "dataset" / "text.scp"
    assert text_scp.read_text().splitlines()[:2] == ["w0000 the cat sat", "w0001 on the mat today"]
    names = _task_run_names(state.state_details.flow_run_id)
    assert names.count("dataset-dev-text") == 1 and names.count("dataset-eval-text") == 1
    assert {"score-WER-dev", "score-CER-eval", "score-WordStats-dev"} <= set(names)
    before = text_scp.stat().st_mtime_ns
    assert metrics(config=[str(cfg)], inference_config=[str(ipath)]) == results
    assert text_scp.stat().st_mtime_ns == before  # reused, as ESPnet3 does


def test_a_failing_dataset_column_fails_the_run_on_one_line(prefect_server, tmp_path):
    from espnet3_prefect.flows.metrics import metrics

    ipath = write_yaml(tmp_path / "inference.yaml", word_config(tmp_path, n=3))
    (tmp_path / "inference" / "dev").mkdir(parents=True)
    (tmp_path / "inference" / "dev" / "hyp.scp").write_text("w0000 a\nw0001 b\nw0002 c\n")
    cfg = metrics_cfg(
        tmp_path,
        tmp_path / "inference",
        metrics=[{"metric": {"_target_": WER_T}, "inputs": {"ref": "dataset:transcript", "hyp": "hyp"}}],
    )
    with pytest.raises(Exception) as err:
        metrics(config=[str(cfg)], inference_config=[str(ipath)])
    message = str(err.value)
    assert "dataset:transcript of dev: dataset:transcript: item 0 of test set 'dev' has no 'transcript'" in message
    assert "\n" not in message
    assert not (tmp_path / "inference" / "metrics.json").exists()
    assert not (tmp_path / "inference" / "dev" / "dataset" / "transcript.scp").exists()


def _png_ok(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG that decodes."""
    import io

    from matplotlib.image import imread

    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(io.BytesIO(data))
    return pixels.shape[1], pixels.shape[0]


def test_evaluate_history_cache_and_a_new_checkpoint(prefect_server, tmp_path):
    from prefect import get_client

    from espnet3_prefect.flows.evaluate import evaluate

    ckpt = tmp_path / "model.ckpt"
    ckpt.write_text("0\n")
    icfg = write_yaml(tmp_path / "inference.yaml", word_config(tmp_path, n=25, checkpoint=ckpt))
    # the reference is the dataset's own column: evaluate passes its inference config to metrics
    mcfg = write_yaml(
        tmp_path / "metrics.yaml",
        {"metrics": [{"metric": {"_target_": WER_T}, "inputs": {"ref": "dataset:text", "hyp": "hyp"}}]},
    )
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
    assert _png_ok((out / "evaluate_history.png").read_bytes()) == (800, 400)  # one panel: WER
    with get_client(sync_client=True) as client:
        latest = latest_artifact(client, "evaluate-trend")
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


def test_evaluate_scores_test_sets_in_upstream_measure_order(tmp_path):
    """ESPnet3's measure() with no dataset.test in the metrics config scores the inference folders
    sorted by name; evaluate fills dataset.test in that order, not the inference config's."""
    from espnet3_prefect.checkpoints.evaluation import plan_evaluation

    (tmp_path / "model.ckpt").write_text("0\n")
    cfg = word_config(tmp_path)
    cfg["dataset"]["test"] = [{"name": "valid", "n": 5}, {"name": "test", "n": 5}]
    icfg = write_yaml(tmp_path / "inference.yaml", cfg)
    mcfg = write_yaml(
        tmp_path / "metrics.yaml",
        {"metrics": [{"metric": {"_target_": WER_T}, "inputs": {"ref": "dataset:text", "hyp": "hyp"}}]},
    )
    plan = plan_evaluation([str(icfg)], [str(mcfg)])
    assert plan["metrics_plan"].test_sets == ["test", "valid"]
