"""The overrides ``evaluate`` builds arrive in the loaded configs as the very strings they carry.

``plan_evaluation`` fills the inference config's checkpoint key, the model's identity
(``evaluate_model_id``), and the metrics config's ``inference_dir`` and ``dataset.test`` through
``key=value`` overrides, which ``load_config`` reads with Hydra's override grammar. A path with
non-ASCII letters, ``,``, ``(``, ``~`` or spaces, a model id of 16 digits or ``1e1...``, a test set
named ``2024``: each must come back unchanged and a string. No server, no cluster.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from espnet3_prefect.checkpoints import evaluation
from espnet3_prefect.checkpoints.evaluation import (
    MODEL_ID_KEY,
    checkpoint_override,
    dataset_test_override,
    inference_dir_override,
    model_id_override,
    plan_evaluation,
)
from espnet3_prefect.config.load import apply_override, load_config
from tests.conftest import write_yaml
from tests.helpers.wordrecipe import word_config

PATHS = [
    "/exp/modèle/valid.acc.ave.pth",
    "/exp/日本語/ckpt",
    "/exp/a,b/c.pth",
    "/exp/run (2)/epoch=3-step=1200.ckpt",
    "~/exp/model.pth",
    "/exp/a~b/model.pth",
    "/exp/with space/ model .pth",
    "/exp/it's/model.pth",
    '/exp/say "hi"/model.pth',
    "C:\\exp\\model\\",
    "/exp/a\\'b",
    "/exp/[1, 2]/{k: v}/x=y:z",
    "1200",
    "1e-3",
    "true",
    "null",
    "",
    "/exp/modèle, v2 (it's) ~ [x]/é.pth",
]

MODEL_IDS = ["1234567890123456", "1e10000000000000", "0000000000000017", "12345678901234e5", "0123456789abcdef"]


@pytest.fixture
def infer_yaml(tmp_path) -> Path:
    return write_yaml(tmp_path / "inference.yaml", {"model": {"ckpt": "/old.pth"}, "inference_dir": "/old"})


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("present", [True, False], ids=["set", "add"])
def test_a_checkpoint_path_round_trips_into_the_config(infer_yaml, path, present):
    key = "model.ckpt" if present else "model.new_ckpt"
    item = checkpoint_override(key, path, present)
    assert item.startswith(key if present else f"+{key}=")
    value = OmegaConf.select(load_config([infer_yaml], [item]), key)
    assert isinstance(value, str) and value == path

    cfg = OmegaConf.create({"model": {"ckpt": 0}})
    apply_override(cfg, item)
    assert OmegaConf.select(cfg, key) == path


@pytest.mark.parametrize("path", PATHS)
def test_inference_dir_round_trips_into_the_metrics_config(tmp_path, path):
    metrics_yaml = write_yaml(tmp_path / "metrics.yaml", {"metrics": []})
    value = load_config([metrics_yaml], [inference_dir_override(path)]).inference_dir
    assert isinstance(value, str) and value == path
    assert inference_dir_override(Path("/exp/modèle (1)")) == "+inference_dir='/exp/modèle (1)'"


@pytest.mark.parametrize("model_id", MODEL_IDS)
def test_a_model_id_stays_a_string(infer_yaml, model_id):
    value = load_config([infer_yaml], [model_id_override(model_id)])[MODEL_ID_KEY]
    assert isinstance(value, str) and value == model_id


def test_test_set_names_stay_strings(tmp_path):
    names = ["2024", "dév", "a,b", "true", "null", "1e3", "x(1)", "it's"]
    metrics_yaml = write_yaml(tmp_path / "metrics.yaml", {"metrics": []})
    cfg = load_config([metrics_yaml], [dataset_test_override(names)])
    assert OmegaConf.to_container(cfg.dataset.test) == [{"name": name} for name in names]


def test_plan_evaluation_with_a_hard_path_and_a_numeric_looking_model_id(tmp_path, monkeypatch):
    """The whole plan, in a folder whose name Hydra's unquoted grammar refuses: the checkpoint path,
    the model id and inference_dir reach the configs infer and metrics load, unchanged."""
    root = tmp_path / "modèle, v2 (run ~1)"
    ckpt = root / "ckpt dir" / "epoch=3-step=1200.ckpt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_text("0\n")
    cfg = word_config(root, n=4, checkpoint=root / "model.ckpt")
    (root / "model.ckpt").write_text("0\n")
    cfg["dataset"]["test"] = [{"name": "dév", "n": 2}, {"name": "2024", "n": 2}]
    infer_yaml = write_yaml(root / "inference.yaml", cfg)
    metrics_yaml = write_yaml(
        root / "metrics.yaml",
        {"metrics": [{"metric": {"_target_": "espnet3.systems.esp2_asr.metrics.wer.WER"}, "inputs": ["ref", "hyp"]}]},
    )
    real_identity = evaluation.model_identity

    def digits_identity(icfg):  # an id that reads as an integer when unquoted
        return {**real_identity(icfg), "id": "1234567890123456"}

    monkeypatch.setattr(evaluation, "model_identity", digits_identity)

    plan = plan_evaluation([str(infer_yaml)], [str(metrics_yaml)], checkpoint=str(ckpt))

    assert plan["checkpoint"]["key"] == "model.checkpoint" and plan["checkpoint"]["path"] == str(ckpt.resolve())
    icfg = load_config([infer_yaml], plan["infer_overrides"])
    assert icfg.model.checkpoint == str(ckpt.resolve())
    assert icfg[MODEL_ID_KEY] == "1234567890123456" and isinstance(icfg[MODEL_ID_KEY], str)
    assert plan["inference_dir"] == (root / "inference").resolve()
    mcfg = load_config([metrics_yaml], plan["metrics_overrides"])
    assert mcfg.inference_dir == str((root / "inference").resolve())
    assert [t.name for t in mcfg.dataset.test] == ["2024", "dév"]
    assert plan["metrics_plan"].test_sets == ["2024", "dév"]
