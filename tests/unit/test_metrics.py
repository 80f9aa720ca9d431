"""Our ESPnet3 202611 metric API: reading, cleaning, chunking, alignment text, keys, bindings,
dataset: columns and one-line errors (no Prefect; the flow is in tests/integration)."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from espnet3_prefect._internal.scp import ScpField, count_aligned, iter_scp
from espnet3_prefect.config.targets import espnet3_installed, locate
from espnet3_prefect.errors import BadInputError, ConfigError
from espnet3_prefect.metrics import (
    CER,
    WER,
    BaseMetric,
    Field,
    MetricContractError,
    MetricDeclarationError,
    TextCleaner,
    check_metric_output,
)
from espnet3_prefect.metrics.dataset_columns import dataset_column_scp, source_path
from espnet3_prefect.metrics.metric_plan import metrics_json
from espnet3_prefect.metrics.prepare import load_inference_config, prepare_metrics
from tests.helpers.metrics_recipes import ColumnOrganizer

WER_T = "espnet3.systems.esp2_asr.metrics.wer.WER"
CER_T = "espnet3.systems.esp2_asr.metrics.cer.CER"
pytestmark = pytest.mark.skipif(espnet3_installed(), reason="tests our own classes: espnet3 must be absent")


def scp_pair(root: Path, refs: list[str], hyps: list[str], test: str = "t") -> dict[str, Path]:
    out = root / test
    out.mkdir(parents=True, exist_ok=True)
    (out / "ref.scp").write_text("".join(f"u{i} {r}\n" for i, r in enumerate(refs)), encoding="utf-8")
    (out / "hyp.scp").write_text("".join(f"u{i} {h}\n" for i, h in enumerate(hyps)), encoding="utf-8")
    return {"ref": out / "ref.scp", "hyp": out / "hyp.scp"}


# -- WER / CER: results, "." placeholder, rounding, errors ------------------------------------------

# Counted by hand with ESPnet3's rule: a text that cleans to nothing becomes "." (one word, one char).
CASES = [
    # "a b c" -> "a x c d": H2 S1 I1 | "d e" -> ".": S1 D1 | "f": H1         WER 4/6
    # chars (5) -> (7): H4 S1 I2     | (3) -> (1): S1 D2   | H1             CER 6/9
    (["a b c", "d e", "f"], ["a x c d", "", "f"], 66.67, 66.67),
    # every hyp empty: "one two" -> ".": S1 D1 | "three" -> ".": S1 = 3/3; chars S1 D6 + S1 D4 = 12/12
    (["one two", "three"], ["", ""], 100.0, 100.0),
    (["57901", "238"], ["57901", "238"], 0.0, 0.0),
    # one digit wrong: WER counts the word (1/3), CER one character of 8
    (["12345", "9", "00"], ["12845", "9", "00"], 33.33, 12.5),
    # an empty reference is "." too: the hyp "c" substitutes it (1 of 3 words, 1 of 4 chars)
    (["a b", ""], ["a b", "c"], 33.33, 25.0),
]


@pytest.mark.parametrize("refs, hyps, wer, cer", CASES)
def test_wer_cer_results_hold_only_the_rate(tmp_path, refs, hyps, wer, cer):
    paths = scp_pair(tmp_path, refs, hyps)
    assert WER()(paths, "t", tmp_path) == {"WER": wer}
    assert CER()(paths, "t", tmp_path) == {"CER": cer}


def test_no_references_at_all_is_an_error_and_writes_nothing(tmp_path):
    paths = scp_pair(tmp_path, [], [])
    (tmp_path / "t" / "ref.scp").write_text("\n  \n")
    with pytest.raises(BadInputError, match="nothing to score: the references have no words"):
        WER()(paths, "t", tmp_path)
    assert not (tmp_path / "t" / "wer_alignment").exists()


def test_without_output_dir_nothing_is_written(tmp_path):
    paths = scp_pair(tmp_path, ["a b"], ["a"])
    assert WER()(paths, "t") == {"WER": 50.0}
    assert not (tmp_path / "t" / "wer_alignment").exists()


def test_alignment_file_is_jiwers_text_per_chunk_then_a_summary(tmp_path):
    paths = scp_pair(tmp_path, ["a b c", "d e"], ["a x c d", ""])
    WER()(paths, "t", tmp_path)
    assert (tmp_path / "t" / "wer_alignment").read_text(encoding="utf-8") == (
        "=== SENTENCE 1 ===\n\nREF: a b c *\nHYP: a x c d\n       S   I\n\n"
        "=== SENTENCE 2 ===\n\nREF: d e\nHYP: . *\n     S D\n"
        "\nWER: 80.00 (hits=2, substitutions=2, deletions=1, insertions=1)\n"
    )
    CER()(paths, "t", tmp_path)
    assert (
        (tmp_path / "t" / "cer_alignment")
        .read_text()
        .endswith("\nCER: 75.00 (hits=4, substitutions=2, deletions=2, insertions=2)\n")
    )


def test_chunks_of_1000_restart_jiwers_sentence_numbers(tmp_path):
    n = 2500
    paths = scp_pair(tmp_path, [f"w{i % 7} x y" for i in range(n)], [f"w{i % 7} x" for i in range(n)])
    calls = []

    class Counting(WER):
        def update(self, *, ref, hyp):
            calls.append(len(ref))
            super().update(ref=ref, hyp=hyp)

    assert Counting()(paths, "t", tmp_path) == {"WER": 33.33}
    assert calls == [1000, 1000, 500]
    text = (tmp_path / "t" / "wer_alignment").read_text()
    assert text.count("=== SENTENCE 1 ===") == 3 and text.count("=== SENTENCE 1000 ===") == 2
    assert "=== SENTENCE 1001 ===" not in text and text.count("=== SENTENCE 500 ===") == 3


def test_reading_strips_lines_and_values_and_skips_blank_lines(tmp_path):
    out = tmp_path / "t"
    out.mkdir()
    (out / "ref.scp").write_text("  u1 \t a  b \n\n   \nu2 c\r\nu3\n", encoding="utf-8")
    (out / "hyp.scp").write_text("u1 a b\nu2  c \nu3    \n", encoding="utf-8")
    rows = list(WER().iter_inputs({"ref": out / "ref.scp", "hyp": out / "hyp.scp"}, "ref", "hyp"))
    assert rows == [
        ("u1", {"ref": "a  b", "hyp": "a b"}),
        ("u2", {"ref": "c", "hyp": "c"}),
        ("u3", {"ref": "", "hyp": ""}),
    ]
    assert [(u, v) for _, u, v in iter_scp(out / "ref.scp")] == [("u1", "a  b"), ("u2", "c"), ("u3", "")]


def test_lockstep_mismatches_fail_on_one_line_naming_both_files(tmp_path):
    out = tmp_path / "t"
    out.mkdir()
    (out / "ref.scp").write_text("u1 a\nu2 b\nu3 c\n")
    (out / "hyp.scp").write_text("u1 a\nu3 c\nu2 b\n")
    data = {"ref": out / "ref.scp", "hyp": out / "hyp.scp"}
    with pytest.raises(BadInputError) as err:
        WER()(data, "t", tmp_path)
    assert "\n" not in str(err.value)
    assert f"{out / 'hyp.scp'} row 2: utt_id 'u3' where {out / 'ref.scp'} has 'u2'" in str(err.value)
    assert not (out / "wer_alignment").exists()
    with pytest.raises(BadInputError, match="hyp.scp line 2: utt_id 'u3' where .*ref.scp line 2 has 'u2'"):
        count_aligned(data)  # the task's pre-check, with line numbers
    (out / "hyp.scp").write_text("u1 a\n")
    with pytest.raises(BadInputError, match="hyp.scp ends after 1 rows but .*ref.scp goes on with 'u2'"):
        WER()(data, "t", tmp_path)


# -- clean_types ------------------------------------------------------------------------------------


def test_clean_types_follow_espnet2_names(tmp_path):
    assert TextCleaner(None)(" Kept  As Is ") == " Kept  As Is "
    assert TextCleaner("korean_cleaner")(" 3 cats ") == "삼 씨에이티에스"
    assert TextCleaner(["korean_cleaner"])("Z9") == "지구"
    paths = scp_pair(tmp_path, ["1 2"], ["일 이"])
    assert WER(clean_types=["korean_cleaner"])(paths, "t", tmp_path) == {"WER": 0.0}
    with pytest.raises(ConfigError, match="clean_types: 'lowercase' is not supported; espnet2's TextCleaner knows"):
        TextCleaner(["lowercase"])
    with pytest.raises(ConfigError, match="clean_types: 'tacotron' needs the tacotron-cleaner package"):
        WER(clean_types=["tacotron"])
    with pytest.raises(ConfigError, match="clean_types: 'whisper_basic' needs the openai-whisper package"):
        CER(clean_types="whisper_basic")


def test_clean_types_errors_name_the_metric_entry(tmp_path):
    scp_pair(tmp_path, ["a"], ["a"])
    cfg = _cfg(
        tmp_path,
        metrics=[{"metric": {"_target_": WER_T, "clean_types": ["jaconv"]}, "inputs": {"ref": "ref", "hyp": "hyp"}}],
    )
    with pytest.raises(ConfigError) as err:
        prepare_metrics(cfg)
    assert str(err.value).startswith("metrics[0].metric.clean_types: 'jaconv' needs the jaconv package")


# -- the BaseMetric mirror --------------------------------------------------------------------------


class Lengths(BaseMetric):
    inputs = (Field("hyp", "text"), Field("ref", "text", optional=True))
    outputs = (Field("n", "number"), Field("chunks", "number"))
    chunk_size = 2

    def __init__(self):
        super().__init__()
        self.add_state("n", 0, "sum")
        self.add_state("chunks", 0, "sum")
        self.add_state("lens", [], "cat")

    def update(self, *, hyp, ref=None):
        self.chunks += 1
        self.n += len(hyp)
        self.lens.extend(len(h) for h in hyp)

    def compute(self):
        return {"n": self.n, "chunks": self.chunks}

    def write_artifacts(self, test_dir):
        (test_dir / "lens.txt").write_text(" ".join(map(str, self.lens)))


def test_base_metric_mirror_chunks_states_and_artifacts(tmp_path):
    paths = scp_pair(tmp_path, ["a", "b", "c"], ["x", "yy", ""])
    metric = Lengths()
    assert metric({"hyp": paths["hyp"]}, "t", tmp_path) == {"n": 3, "chunks": 2}
    assert (tmp_path / "t" / "lens.txt").read_text() == "1 2 0"
    assert metric.state() == {"n": 3, "chunks": 2, "lens": [1, 2, 0]}
    merged = metric.merge_states([metric.state(), {"n": 1, "chunks": 1, "lens": [9]}])
    assert merged == {"n": 4, "chunks": 3, "lens": [1, 2, 0, 9]}
    metric.load_state(merged)
    assert metric.compute() == {"n": 4, "chunks": 3}
    metric.reset()
    assert metric.state() == {"n": 0, "chunks": 0, "lens": []}
    with pytest.raises(ValueError, match="do not match the registered"):
        metric.load_state({"n": 1})
    with pytest.raises(ValueError, match="already defined"):
        metric.add_state("n", 0, "sum")
    with pytest.raises(MetricContractError, match=r"Lengths input 'hyp'\[0\] is int, must be text"):
        metric.update(hyp=[3])
    with pytest.raises(MetricContractError, match="Lengths got input 'other'"):
        metric.update(hyp=["a"], other=["b"])
    with pytest.raises(MetricContractError, match="input 'ref' has 2 items, 'hyp' has 1"):
        metric.update(hyp=["a"], ref=["b", "c"])


def test_declarations_are_checked_at_construction():
    class Undeclared(BaseMetric):
        def update(self, **values):
            pass

        def compute(self):
            return {}

    with pytest.raises(MetricDeclarationError, match="Undeclared declares no inputs/outputs"):
        Undeclared()

    class TextOut(Undeclared):
        inputs = (Field("hyp", "text"),)
        outputs = (Field("words", "text"),)

    with pytest.raises(TypeError, match="outputs field 'words' must have kind 'number'"):
        TextOut()

    class OptionalFirst(Undeclared):
        inputs = (Field("ref", "text", optional=True), Field("hyp", "text"))
        outputs = (Field("x", "number"),)

    with pytest.raises(MetricDeclarationError, match="required fields before optional"):
        OptionalFirst()


def test_results_are_checked_against_declared_outputs():
    check_metric_output(WER(), {"WER": 1.5})
    with pytest.raises(MetricContractError, match=r"declares outputs \['WER'\] but returned \['wer'\]"):
        check_metric_output(WER(), {"wer": 1.5})
    with pytest.raises(MetricContractError, match="'WER' must be number"):
        check_metric_output(WER(), {"WER": True})


def test_a_metric_copies_without_its_spooled_alignment(tmp_path):
    paths = scp_pair(tmp_path, ["a b"], ["a"])
    metric = WER()
    metric.collect_artifacts = True
    metric.update(ref=["a b"], hyp=["a"])
    clone = copy.deepcopy(metric)
    assert clone._spool is None and clone.hits == 1
    assert clone(paths, "t", tmp_path) == {"WER": 50.0}


# -- the metrics config -----------------------------------------------------------------------------


def _cfg(root, **extra):
    base = {
        "inference_dir": str(root),
        "metrics": [{"metric": {"_target_": WER_T}, "inputs": {"ref": "ref", "hyp": "hyp"}}],
    }
    base.update(extra)
    return OmegaConf.create(base)


def test_espnet3_stock_paths_resolve_to_ours_and_keep_their_key(tmp_path):
    assert locate(WER_T) is WER and locate(CER_T) is CER
    scp_pair(tmp_path, ["a"], ["a"])
    plan = prepare_metrics(
        _cfg(
            tmp_path,
            metrics=[
                {"metric": {"_target_": WER_T, "clean_types": None}, "inputs": {"ref": "ref", "hyp": "hyp"}},
                {"metric": {"_target_": "espnet3_prefect.metrics.CER"}, "inputs": ["ref", "hyp"]},
                {"metric": {"_target_": "tests.unit.test_metrics.Lengths"}, "inputs": {"hyp": "hyp"}},
            ],
        )
    )
    assert [s.key for s in plan.metrics] == [WER_T, "espnet3_prefect.metrics.CER", "tests.unit.test_metrics.Lengths"]
    assert [s.label for s in plan.metrics] == ["WER", "CER", "Lengths"]
    assert [s.bindings for s in plan.metrics] == [
        {"ref": "ref", "hyp": "hyp"},
        {"ref": "ref", "hyp": "hyp"},
        {"hyp": "hyp"},
    ]
    assert all(s.declared for s in plan.metrics)
    assert plan.metrics[0].input_paths(tmp_path, "t") == {"ref": tmp_path / "t/ref.scp", "hyp": tmp_path / "t/hyp.scp"}


def test_test_sets_are_the_listed_names_else_sorted_visible_folders(tmp_path):
    for name in ("test_b", "test_a", ".cache"):
        scp_pair(tmp_path, ["a"], ["a"], test=name)
    assert prepare_metrics(_cfg(tmp_path)).test_sets == ["test_a", "test_b"]
    assert prepare_metrics(_cfg(tmp_path, dataset={"test": [{"name": "test_b"}, {"name": "test_a"}]})).test_sets == [
        "test_b",
        "test_a",
    ]
    assert prepare_metrics(_cfg(tmp_path, dataset={"test": []})).test_sets == ["test_a", "test_b"]


@pytest.mark.parametrize(
    "entry, expected",
    [
        (
            {"metric": {"_target_": WER_T}},
            "metrics[0].inputs: missing; WER declares inputs ref, hyp: bind each to an SCP stem or dataset:<column>",
        ),
        (
            {"metric": {"_target_": WER_T}, "inputs": {"hyp": "hyp"}},
            "metrics[0].inputs: WER declares inputs ref, hyp; missing ['ref'], unknown []",
        ),
        (
            {"metric": {"_target_": WER_T}, "inputs": {"ref": "ref", "hyp": "hyp", "extra": "x"}},
            "metrics[0].inputs: WER declares inputs ref, hyp; missing [], unknown ['extra']",
        ),
        (
            {"metric": {"_target_": WER_T}, "inputs": {"ref": "dataset:", "hyp": "hyp"}},
            "metrics[0].inputs.ref: 'dataset:' must be an SCP stem",
        ),
        (
            {"metric": {"_target_": WER_T}, "inputs": {"ref": "../ref", "hyp": "hyp"}},
            "metrics[0].inputs.ref: '../ref' must be an SCP stem inside the test set's folder",
        ),
        (
            {"metric": {"_target_": WER_T}, "inputs": {"ref": "dataset:a/b", "hyp": "hyp"}},
            "metrics[0].inputs.ref: 'dataset:a/b' must name one column",
        ),
        (
            {"metric": {"_target_": WER_T, "ref_key": "ref"}, "inputs": {"ref": "ref", "hyp": "hyp"}},
            "metrics[0].metric: _target_ 'espnet3.systems.esp2_asr.metrics.wer.WER': instantiation failed",
        ),
        (
            {
                "metric": {"_target_": "espnet3.systems.esp2_asr.metrics.ter.TER", "bpemodel": "bpe.model"},
                "inputs": {"ref": "ref", "hyp": "hyp"},
            },
            "metrics[0].metric._target_: espnet3.systems.esp2_asr.metrics.ter.TER needs espnet3 installed",
        ),
        (
            {"metric": {"_target_": "espnet3.systems.asr.metrics.wer.WER"}, "inputs": {"ref": "ref", "hyp": "hyp"}},
            "metrics[0].metric._target_: cannot import 'espnet3.systems.asr.metrics.wer.WER'"
            if importlib.util.find_spec("espnet3")
            else "metrics[0].metric._target_: 'espnet3.systems.asr.metrics.wer.WER' is not an ESPnet3 class "
            "espnet3-prefect provides while espnet3 is not installed; "
            "did you mean 'espnet3.systems.esp2_asr.metrics.wer.WER'?",
        ),
        (
            {"metric": {"_target_": WER_T}, "inputs": {"ref": "ref", "hyp": "hyp"}, "weight": 2},
            "metrics[0].weight: unknown key",
        ),
        (
            {"metric": {"_target_": "tests.unit.test_metrics.Lengths"}, "inputs": {"hyp": "hyp.scp"}},
            "metrics[0].inputs.hyp: ",
        ),
    ],
)
def test_binding_errors_are_one_line_and_name_the_key(tmp_path, entry, expected):
    scp_pair(tmp_path, ["a"], ["a"])
    with pytest.raises(ConfigError) as err:
        prepare_metrics(_cfg(tmp_path, metrics=[entry]))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_every_scp_input_is_checked_before_scoring(tmp_path):
    scp_pair(tmp_path, ["a"], ["a"], test="test_a")
    scp_pair(tmp_path, ["a"], ["a"], test="test_b")
    (tmp_path / "test_b/hyp.scp").unlink()
    with pytest.raises(
        ConfigError,
        match=r"metrics\[0\].inputs.hyp: .*test_b/hyp.scp not found; run infer for "
        r"'test_b' first",
    ):
        prepare_metrics(_cfg(tmp_path))
    cfg = _cfg(tmp_path, metrics=[{"metric": {"_target_": WER_T}, "inputs": {"ref": "ref.scp", "hyp": "ref"}}])
    with pytest.raises(ConfigError, match=r"inputs.ref: .*ref.scp.scp not found; name the stem 'ref', '.scp' is added"):
        prepare_metrics(cfg)
    assert prepare_metrics(_cfg(tmp_path / "later"), check_inputs=False).test_sets == []
    with pytest.raises(ConfigError, match="does not exist; run infer first"):
        prepare_metrics(_cfg(tmp_path / "later"))


@pytest.mark.parametrize(
    "change, expected",
    [
        ({"metrics": None}, "metrics: missing"),
        ({"metrics": []}, "metrics: must be a non-empty list"),
        ({"metrics": [{"metric": {"clean_types": None}}]}, "metrics[0].metric._target_: missing"),
        (
            {
                "metrics": [
                    {"metric": {"_target_": CER_T}, "inputs": ["ref", "hyp"]},
                    {"metric": {"_target_": CER_T}, "inputs": ["ref", "hyp"]},
                ]
            },
            f"metrics[1].metric._target_: '{CER_T}' is also metrics[0]",
        ),
        ({"inference_dir": None}, "inference_dir: missing"),
    ],
)
def test_config_structure_errors(tmp_path, change, expected):
    scp_pair(tmp_path, ["a"], ["a"])
    cfg = _cfg(tmp_path)
    for key, value in change.items():
        cfg[key] = value
    with pytest.raises(ConfigError) as err:
        prepare_metrics(cfg)
    assert expected in str(err.value) and "\n" not in str(err.value)


class StreamingCount:
    """Our extension: any callable; its inputs arrive as ScpField (a path that also iterates)."""

    ref_key, hyp_key = "ref", "hyp"

    def __call__(self, data, test_name, inference_dir):
        assert isinstance(data["hyp"], ScpField)
        return {"n": sum(1 for _ in data["hyp"])}


def test_plain_callables_keep_our_defaults(tmp_path):
    scp_pair(tmp_path, ["a"], ["a"])
    plan = prepare_metrics(_cfg(tmp_path, metrics=[{"metric": {"_target_": "tests.unit.test_metrics.StreamingCount"}}]))
    [spec] = plan.metrics
    assert spec.bindings == {"ref": "ref", "hyp": "hyp"} and not spec.declared


# -- dataset:<column> -------------------------------------------------------------------------------


def _icfg(tmp_path, tests=("dev",)):
    return OmegaConf.create(
        {
            "inference_dir": str(tmp_path / "inference"),
            "dataset": {
                "_target_": "tests.helpers.metrics_recipes.ColumnOrganizer",
                "test": [{"name": t} for t in tests],
            },
            "provider": {"_target_": "espnet3.systems.base.inference_provider.InferenceProvider"},
        }
    )


def test_dataset_column_written_once_then_reused(tmp_path):
    icfg = _icfg(tmp_path)
    out = tmp_path / "inference"
    ColumnOrganizer.builds = 0
    path = dataset_column_scp(icfg, out, "dev", "text")
    assert path == out / "dev" / "dataset" / "text.scp" == source_path(out, "dev", "dataset:text")
    assert path.read_text(encoding="utf-8") == "d1 héllo wörld\nd2 \n"
    assert dataset_column_scp(icfg, out, "dev", "n").read_text() == "d1 2\nd2 0\n"
    assert dataset_column_scp(icfg, out, "dev", "ok").read_text() == "d1 True\nd2 False\n"
    assert ColumnOrganizer.builds == 3
    assert dataset_column_scp(None, out, "dev", "text") == path and ColumnOrganizer.builds == 3  # reused
    assert sorted(p.name for p in path.parent.iterdir()) == ["n.scp", "ok.scp", "text.scp"]  # nothing aside


@pytest.mark.parametrize(
    "test, column, expected",
    [
        ("noid", "text", None),
        (
            "dev",
            "speech",
            "dataset:speech: item 0 of test set 'dev' has no 'speech'; it has ['n', 'ok', 'text', 'utt_id']",
        ),
        ("badid", "text", "test set 'badid' item 0: utt_id 'a b': must be a plain token"),
        ("multiline", "text", "dataset:text: the value of 'm1' in test set 'multiline' holds a line break"),
    ],
)
def test_dataset_column_items(tmp_path, test, column, expected):
    icfg = _icfg(tmp_path, tests=(test,))
    out = tmp_path / "inference"
    if expected is None:  # no idx_key: the index is the id, as infer does
        assert dataset_column_scp(icfg, out, test, column).read_text() == "0 a\n1 b\n"
        return
    with pytest.raises(BadInputError) as err:
        dataset_column_scp(icfg, out, test, column)
    assert expected in str(err.value)
    assert not (out / test / "dataset" / f"{column}.scp").exists()
    assert [p.name for p in (out / test / "dataset").iterdir()] == []  # the partial file is gone


def test_dataset_inputs_need_the_inference_config_and_are_planned_once(tmp_path):
    out = tmp_path / "inference"
    scp_pair(out, ["a"], ["a"], test="dev")
    metrics = [
        {"metric": {"_target_": WER_T}, "inputs": {"ref": "dataset:text", "hyp": "hyp"}},
        {"metric": {"_target_": CER_T}, "inputs": {"ref": "dataset:text", "hyp": "hyp"}},
        {"metric": {"_target_": "tests.unit.test_metrics.Lengths"}, "inputs": {"hyp": "hyp", "ref": "dataset:n"}},
    ]
    cfg = OmegaConf.create({"metrics": metrics, "dataset_artifacts": {"speech": {"type": "wav", "sample_rate": 8000}}})
    with pytest.raises(ConfigError, match=r"^inference_dir: missing"):
        prepare_metrics(cfg)
    with pytest.raises(ConfigError, match=r"metrics\[0\].inputs.ref: 'dataset:text' needs the inference config"):
        prepare_metrics(OmegaConf.merge(cfg, {"inference_dir": str(out)}))
    plan = prepare_metrics(cfg, inference_config=_icfg(tmp_path))  # inference_dir from the inference config
    assert plan.inference_dir == out.resolve() and plan.test_sets == ["dev"]
    assert plan.dataset_columns() == [("dev", "text"), ("dev", "n")]
    assert plan.dataset_artifacts == {"speech": {"type": "wav", "sample_rate": 8000}}
    dataset_column_scp(plan.inference_config, out, "dev", "text")
    with pytest.raises(ConfigError, match=r"metrics\[2\].inputs.ref: 'dataset:n' needs the inference config"):
        prepare_metrics(OmegaConf.merge(cfg, {"inference_dir": str(out)}))  # text.scp is there, n.scp not yet
    dataset_column_scp(plan.inference_config, out, "dev", "n")
    assert prepare_metrics(OmegaConf.merge(cfg, {"inference_dir": str(out)})).test_sets == ["dev"]  # files exist now
    bad = _icfg(tmp_path)
    bad.provider._target_ = "tests.helpers.metrics_recipes.ColumnDataset"
    with pytest.raises(
        ConfigError,
        match="provider._target_: 'tests.helpers.metrics_recipes.ColumnDataset' has no "
        r"build_dataset\(config\)",
    ):
        prepare_metrics(cfg, inference_config=bad)


def test_inference_config_from_files_or_a_mapping(tmp_path):
    path = tmp_path / "inference.yaml"
    path.write_text("inference_dir: exp/x\nidx_key: utt_id\n")
    assert load_inference_config(None) is None
    assert load_inference_config([str(path)], ["idx_key=id"]).idx_key == "id"
    assert load_inference_config({"inference_dir": "exp/y", "a": "${inference_dir}/z"}).a == "exp/y/z"
    with pytest.raises(ConfigError, match="inference_overrides: given without an inference config"):
        load_inference_config(None, ["a=1"])


def test_metrics_json_is_upstreams_bytes():
    text = metrics_json({WER_T: {"tëst": {"WER": 1.5}}})
    assert text == json.dumps({WER_T: {"tëst": {"WER": 1.5}}}, indent=2, ensure_ascii=False)
    assert "tëst" in text and not text.endswith("\n")
