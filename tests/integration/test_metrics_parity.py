"""Parity with ESPnet3 202611's ``measure()``: the same inference folder scored three ways gives
byte-identical ``metrics.json``, alignment files, ``dataset/<column>.scp`` and custom artifacts:

* upstream ``measure(metrics_cfg, inference_config=icfg)`` (ESPnet3's own WER/CER/BaseMetric),
* our ``metrics`` flow in this venv, where espnet3 is absent (our WER/CER/BaseMetric via the aliases),
* our ``metrics`` flow in the ESPnet3 venv (ESPnet3's classes driven by our flow).

Needs a venv where ESPnet3 202611 imports: ``$E3P_PARITY_PYTHON``, else ``.venv-parity/bin/python``
(``bash scripts/parity_setup.sh``). Skipped when there is none::

    E3P_PARITY_PYTHON=/path/to/python .venv/bin/python -m pytest -m parity tests/integration/test_metrics_parity.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from espnet3_prefect.disk.layout import METRICS_RECORD_NAME
from tests.conftest import ROOT, write_yaml
from tests.helpers.metrics_recipes import build_inference_dir, write_dataset_hyps, write_scp

PARITY_PYTHON = os.environ.get("E3P_PARITY_PYTHON") or str(ROOT / ".venv-parity" / "bin" / "python")
pytestmark = [
    pytest.mark.parity,
    pytest.mark.slow,
    pytest.mark.skipif(
        not Path(PARITY_PYTHON).is_file(),  # decided before the server starts
        reason=f"no ESPnet3 venv: set E3P_PARITY_PYTHON or run scripts/parity_setup.sh ({PARITY_PYTHON} missing)",
    ),
]

WER_T = "espnet3.systems.esp2_asr.metrics.wer.WER"
CER_T = "espnet3.systems.esp2_asr.metrics.cer.CER"
STATS_T = "tests.helpers.metrics_recipes.WordStats"
PROBE = "import espnet3.systems.base.metric, espnet3.systems.esp2_asr.metrics.wer, espnet3.systems.esp2_asr.metrics.cer"


@pytest.fixture(scope="module")
def parity_python() -> str:
    from espnet3_prefect.config.targets import espnet3_installed

    if espnet3_installed():
        pytest.skip("espnet3 is importable here: run these tests from the project's own .venv")
    candidate = PARITY_PYTHON
    probe = subprocess.run([candidate, "-c", PROBE], capture_output=True, text=True, timeout=300)
    if probe.returncode != 0:
        pytest.skip(f"{candidate} cannot import espnet3 202611: {probe.stderr.strip().splitlines()[-1:]}")
    return candidate


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _oracle(
    python: str, mode: str, metrics_yaml: Path, inference_dir: Path, inference_yaml: Path | None, expect_ok: bool = True
) -> subprocess.CompletedProcess:
    argv = [python, "-m", "tests.helpers.metrics_recipes", mode, str(metrics_yaml), f"inference_dir={inference_dir}"]
    if inference_yaml is not None:
        argv += ["--inference-config", str(inference_yaml)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if expect_ok:
        assert proc.returncode == 0, proc.stderr[-4000:]
        if mode == "ours":
            # this checkout's package and flow, not another install's
            assert f"espnet3_prefect from {ROOT}/espnet3_prefect/" in proc.stderr
            assert f"flow from {ROOT}/flows/metrics.py" in proc.stderr
    return proc


def _scp_case(root: Path) -> tuple[Path, Path, None]:
    src = build_inference_dir(root)  # errors, empty hyps, non-ASCII, 2345 utterances, a hidden folder
    metrics_yaml = write_yaml(
        root / "metrics.yaml",
        {
            "inference_dir": "set-per-run",
            "metrics": [
                {"metric": {"_target_": WER_T, "clean_types": None}, "inputs": {"ref": "ref", "hyp": "hyp"}},
                {"metric": {"_target_": CER_T}, "inputs": ["ref", "hyp"]},
                {"metric": {"_target_": STATS_T, "scale": 2.0}, "inputs": {"hyp": "hyp"}},
            ],
        },
    )
    return src, metrics_yaml, None


def _dataset_case(root: Path) -> tuple[Path, Path, Path]:
    tests = {"zeta": 1200, "alpha": 7}  # listed out of order; 1200 rows: two chunks
    src = root / "inference"
    write_dataset_hyps(src, tests)
    inference_yaml = write_yaml(
        root / "inference.yaml",
        {
            "inference_dir": str(src),
            "idx_key": "utt_id",
            "dataset": {
                "_target_": "tests.helpers.metrics_recipes.ParityOrganizer",
                "test": [{"name": name, "n": n} for name, n in tests.items()],
            },
            "provider": {"_target_": "espnet3.systems.base.inference_provider.InferenceProvider"},
        },
    )
    metrics_yaml = write_yaml(
        root / "metrics.yaml",
        {
            "inference_dir": "set-per-run",
            "dataset": {"test": [{"name": name} for name in tests]},
            "metrics": [
                {"metric": {"_target_": WER_T}, "inputs": {"ref": "dataset:text", "hyp": "text"}},
                {
                    "metric": {"_target_": CER_T, "clean_types": ["korean_cleaner"]},
                    "inputs": {"ref": "dataset:text", "hyp": "text"},
                },
                {"metric": {"_target_": STATS_T}, "inputs": {"hyp": "text", "ref": "dataset:n_words"}},
            ],
        },
    )
    return src, metrics_yaml, inference_yaml


@pytest.mark.parametrize("build", [_scp_case, _dataset_case], ids=["scp-inputs", "dataset-inputs"])
def test_metrics_json_and_artifacts_equal_upstream_measure(parity_python, prefect_server, tmp_path, build):
    from espnet3_prefect.flows.metrics import metrics

    src, metrics_yaml, inference_yaml = build(tmp_path / "case")
    runs = {name: tmp_path / name / "inference" for name in ("upstream", "ours", "ours_with_espnet3")}
    for dst in runs.values():
        shutil.copytree(src, dst)
    _oracle(parity_python, "measure", metrics_yaml, runs["upstream"], inference_yaml)
    metrics(
        config=[str(metrics_yaml)],
        overrides=[f"inference_dir={runs['ours']}"],
        inference_config=[str(inference_yaml)] if inference_yaml else None,
    )
    _oracle(parity_python, "ours", metrics_yaml, runs["ours_with_espnet3"], inference_yaml)

    expected = _tree(runs["upstream"])
    produced = sorted(set(expected) - set(_tree(src)))
    assert "metrics.json" in produced and any(p.endswith("/wer_alignment") for p in produced)
    assert any(p.endswith("/cer_alignment") for p in produced) and any(p.endswith("word_stats.txt") for p in produced)
    if inference_yaml is not None:
        assert "zeta/dataset/text.scp" in produced and "alpha/dataset/n_words.scp" in produced
    else:
        # 2345 rows: three chunks, jiwer numbers each from 1 (it skips correct sentences: row 0 is)
        assert (runs["upstream"] / "big" / "wer_alignment").read_text(encoding="utf-8").count("=== SENTENCE 2 ===") == 3
    for name in ("ours", "ours_with_espnet3"):
        got = _tree(runs[name])
        # besides upstream's files, our one hidden record of what metrics.json was computed from (none
        # for dataset: inputs here: this inference config defines only the test sets, nothing infer ran)
        record = got.pop(METRICS_RECORD_NAME, None)
        assert (record is not None) == (inference_yaml is None), f"{name}: {METRICS_RECORD_NAME}"
        assert sorted(got) == sorted(expected), name
        different = [path for path in expected if got[path] != expected[path]]
        assert not different, f"{name}: {different} differ from upstream measure()'s"


def test_no_references_fails_in_both_and_writes_no_metrics_json(parity_python, prefect_server, tmp_path):
    from espnet3_prefect.flows.metrics import metrics

    src = tmp_path / "case" / "inference"
    write_scp(src / "empty" / "ref.scp", [])
    write_scp(src / "empty" / "hyp.scp", [])
    (src / "empty" / "ref.scp").write_text("\n   \n")
    metrics_yaml = write_yaml(
        tmp_path / "metrics.yaml",
        {
            "inference_dir": "set-per-run",
            "metrics": [{"metric": {"_target_": WER_T}, "inputs": {"ref": "ref", "hyp": "hyp"}}],
        },
    )
    up, ours = tmp_path / "upstream" / "inference", tmp_path / "ours" / "inference"
    shutil.copytree(src, up)
    shutil.copytree(src, ours)
    proc = _oracle(parity_python, "measure", metrics_yaml, up, None, expect_ok=False)
    assert proc.returncode != 0 and "nothing to score: the references have no words" in proc.stderr
    with pytest.raises(Exception, match="nothing to score: the references have no words"):
        metrics(config=[str(metrics_yaml)], overrides=[f"inference_dir={ours}"])
    assert _tree(up) == _tree(ours) == _tree(src)  # no metrics.json, no alignment file
