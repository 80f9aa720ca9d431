"""WER/CER against hand-computed counts, streaming SCP checks, and metrics config validation."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from espnet3_prefect.errors import BadInputError, ConfigError
from espnet3_prefect.metrics import CER, WER, TextCleaner
from espnet3_prefect.metrics_stage import prepare_metrics
from espnet3_prefect.scp import ScpField, count_aligned, iter_scp
from espnet3_prefect.targets import locate


def scp_pair(tmp_path: Path, refs: list[str], hyps: list[str], test: str = "t") -> dict[str, Path]:
    out = tmp_path / test
    out.mkdir(parents=True, exist_ok=True)
    (out / "ref.scp").write_text("".join(f"u{i} {r}\n" for i, r in enumerate(refs)))
    (out / "hyp.scp").write_text("".join(f"u{i} {h}\n" for i, h in enumerate(hyps)))
    return {"ref": out / "ref.scp", "hyp": out / "hyp.scp"}


# Hand-computed cases: (refs, hyps, expected WER dict, expected CER dict).
#   1) "a b c" -> "a x c d": S=1 (b->x), I=1 (d), C=2 / chars "a b c" -> "a x c d": S=1, I=2 (" d"), C=4
#   2) "d e" -> "" (empty hyp): D=2 / chars "d e": D=3
#   3) "f" -> "f": C=1 / C=1
CASES = [
    (["a b c", "d e", "f"], ["a x c d", "", "f"],
     {"WER": 66.67, "WER_errors": 4, "WER_ref_len": 6, "WER_sub": 1, "WER_del": 2, "WER_ins": 1, "WER_hit": 3},
     {"CER": 66.67, "CER_errors": 6, "CER_ref_len": 9, "CER_sub": 1, "CER_del": 3, "CER_ins": 2, "CER_hit": 5}),
    # every hyp empty: all deletions, 100 %
    (["one two", "three"], ["", ""],
     {"WER": 100.0, "WER_errors": 3, "WER_ref_len": 3, "WER_sub": 0, "WER_del": 3, "WER_ins": 0, "WER_hit": 0},
     {"CER": 100.0, "CER_errors": 12, "CER_ref_len": 12, "CER_sub": 0, "CER_del": 12, "CER_ins": 0, "CER_hit": 0}),
    # a perfect decode (the DTMF demo's case)
    (["57901", "238"], ["57901", "238"],
     {"WER": 0.0, "WER_errors": 0, "WER_ref_len": 2, "WER_sub": 0, "WER_del": 0, "WER_ins": 0, "WER_hit": 2},
     {"CER": 0.0, "CER_errors": 0, "CER_ref_len": 8, "CER_sub": 0, "CER_del": 0, "CER_ins": 0, "CER_hit": 8}),
    # one digit string wrong: WER counts the whole word, CER one of five characters; 1/3 = 33.33
    (["12345", "9", "00"], ["12845", "9", "00"],
     {"WER": 33.33, "WER_errors": 1, "WER_ref_len": 3, "WER_sub": 1, "WER_del": 0, "WER_ins": 0, "WER_hit": 2},
     {"CER": 12.5, "CER_errors": 1, "CER_ref_len": 8, "CER_sub": 1, "CER_del": 0, "CER_ins": 0, "CER_hit": 7}),
    # empty reference: the hyp words are insertions
    (["a b", ""], ["a b", "c"],
     {"WER": 50.0, "WER_errors": 1, "WER_ref_len": 2, "WER_sub": 0, "WER_del": 0, "WER_ins": 1, "WER_hit": 2},
     {"CER": 33.33, "CER_errors": 1, "CER_ref_len": 3, "CER_sub": 0, "CER_del": 0, "CER_ins": 1, "CER_hit": 3}),
]


@pytest.mark.parametrize("refs, hyps, wer, cer", CASES)
@pytest.mark.parametrize("chunk_size", [1, 1000])
def test_wer_cer_match_hand_computed_counts(tmp_path, refs, hyps, wer, cer, chunk_size):
    paths = scp_pair(tmp_path, refs, hyps)
    assert WER(chunk_size=chunk_size)(paths, "t", tmp_path) == wer
    assert CER(chunk_size=chunk_size)(paths, "t", tmp_path) == cer


def test_alignment_files_mark_each_error(tmp_path):
    paths = scp_pair(tmp_path, ["a b c", "d e"], ["a x c d", ""])
    WER()(paths, "t", tmp_path)
    text = (tmp_path / "t/wer_alignment.txt").read_text()
    assert "u0 S=1 D=0 I=1 C=2\nREF: a b c *\nHYP: a x c d\n       S   I\n" in text
    assert "u1 S=0 D=2 I=0 C=0\nREF: d e\nHYP: * *\n     D D\n" in text
    CER()(paths, "t", tmp_path)
    assert "REF: d <space> e" in (tmp_path / "t/cer_alignment.txt").read_text()


def test_clean_types_apply_to_both_sides(tmp_path):
    paths = scp_pair(tmp_path, ["Hello, World!"], ["hello world"])
    assert WER()(paths, "t", tmp_path)["WER"] == 100.0
    assert WER(clean_types=["lowercase", "remove_punctuation"])(paths, "t", tmp_path)["WER"] == 0.0
    assert TextCleaner("whisper_basic")("[noise] Don't STOP (laughs)") == "don t stop"
    with pytest.raises(ConfigError, match="clean_types: unknown cleaner 'tacotronish'"):
        WER(clean_types=["tacotronish"])


def test_mismatched_utt_ids_name_the_first_mismatch_on_one_line(tmp_path):
    out = tmp_path / "t"
    out.mkdir()
    (out / "ref.scp").write_text("u1 a\nu2 b\nu3 c\n")
    (out / "hyp.scp").write_text("u1 a\nu3 c\nu2 b\n")
    with pytest.raises(BadInputError) as err:
        WER()({"ref": out / "ref.scp", "hyp": out / "hyp.scp"}, "t", tmp_path)
    message = str(err.value)
    assert "\n" not in message
    assert f"{out / 'hyp.scp'} line 2: utt_id 'u3' where {out / 'ref.scp'} line 2 has 'u2'" in message
    assert not (out / "wer_alignment.txt").exists()  # nothing half-written is published
    (out / "hyp.scp").write_text("u1 a\n")
    with pytest.raises(BadInputError, match="hyp.scp: ends after 1 utterances but ref.scp continues with 'u2'"):
        count_aligned({"ref": out / "ref.scp", "hyp": out / "hyp.scp"})


def test_large_test_set_streams_in_chunks(tmp_path):
    n = 20_000
    refs = [f"w{i % 7} x y" for i in range(n)]
    hyps = [f"w{i % 7} x" if i % 4 == 0 else f"w{i % 7} x y" for i in range(n)]
    paths = scp_pair(tmp_path, refs, hyps)
    result = WER(chunk_size=512, alignment=False)(paths, "t", tmp_path)
    assert result["WER_del"] == n // 4 and result["WER_ref_len"] == 3 * n
    assert result["WER"] == round(100 * (n // 4) / (3 * n), 2)


def test_scp_field_is_a_path_and_a_lazy_list(tmp_path):
    path = scp_pair(tmp_path, ["a b", "c"], ["x", ""])["hyp"]
    field = ScpField(path)
    assert Path(field) == path and len(field) == 2
    assert list(field) == ["x", ""] and field[1] == "" and list(field.keys()) == ["u0", "u1"]
    assert list(iter_scp(path)) == [(1, "u0", "x"), (2, "u1", "")]


def test_espnet3_stock_metric_paths_resolve_to_ours():
    assert locate("espnet3.systems.asr.metrics.wer.WER") is WER
    assert locate("espnet3.systems.asr.metrics.cer.CER") is CER


def _cfg(tmp_path, **extra):
    base = {"inference_dir": str(tmp_path),
            "metrics": [{"metric": {"_target_": "espnet3.systems.asr.metrics.wer.WER", "ref_key": "ref", "hyp_key": "hyp"}}]}
    base.update(extra)
    return OmegaConf.create(base)


def test_metrics_config_defaults_and_test_set_discovery(tmp_path):
    scp_pair(tmp_path, ["a"], ["a"], test="test_b")
    scp_pair(tmp_path, ["a"], ["a"], test="test_a")
    (tmp_path / ".prefect-cache").mkdir()
    plan = prepare_metrics(_cfg(tmp_path))
    assert plan.test_sets == ["test_a", "test_b"]  # sorted, hidden folders skipped
    [spec] = plan.metrics
    assert spec.key == "espnet3.systems.asr.metrics.wer.WER" and spec.label == "WER"
    assert spec.inputs == {"ref": "ref.scp", "hyp": "hyp.scp"}
    listed = _cfg(tmp_path, dataset={"test": [{"name": "test_b"}]})
    assert prepare_metrics(listed).test_sets == ["test_b"]


@pytest.mark.parametrize("change, expected", [
    ({"metrics": None}, "metrics: missing"),
    ({"metrics": []}, "metrics: must be a non-empty list"),
    ({"metrics": [{"metric": {"ref_key": "ref"}}]}, "metrics[0].metric._target_: missing"),
    ({"metrics": [{"metric": {"_target_": "nope.Missing"}}]}, "metrics[0].metric._target_: cannot import 'nope.Missing'"),
    ({"metrics": [{"metric": {"_target_": "espnet3_prefect.metrics.WER"}, "weight": 2}]}, "metrics[0].weight: unknown key"),
    ({"metrics": [{"metric": {"_target_": "espnet3_prefect.metrics.WER", "hyp_key": "text"}, "inputs": ["ref", "hyp"]}]},
     "metrics[0]: hyp_key 'text' is not among its inputs (ref, hyp)"),
    ({"metrics": [{"metric": {"_target_": "espnet3_prefect.metrics.CER"}}, {"metric": {"_target_": "espnet3_prefect.metrics.CER"}}]},
     "metrics[1].metric._target_: 'espnet3_prefect.metrics.CER' is also metrics[0]"),
    ({"inference_dir": None}, "inference_dir: missing"),
])
def test_metrics_config_errors_are_one_line_and_name_the_key(tmp_path, change, expected):
    scp_pair(tmp_path, ["a"], ["a"], test="test_a")
    cfg = _cfg(tmp_path)
    for key, value in change.items():
        cfg[key] = value
    with pytest.raises(ConfigError) as err:
        prepare_metrics(cfg)
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_missing_inputs_fail_before_scoring(tmp_path):
    scp_pair(tmp_path, ["a"], ["a"], test="test_a")
    (tmp_path / "test_a/hyp.scp").unlink()
    with pytest.raises(ConfigError, match=r"metrics\[0\] \(WER\) input 'hyp': .*test_a/hyp.scp not found"):
        prepare_metrics(_cfg(tmp_path))
    assert prepare_metrics(_cfg(tmp_path / "later"), check_inputs=False).test_sets == []
    with pytest.raises(ConfigError, match="does not exist; run infer first"):
        prepare_metrics(_cfg(tmp_path / "later"))
