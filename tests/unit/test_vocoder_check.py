"""F5-TTS's vocoder checked before anything starts (espnet3_prefect.config.vocoder): one line naming
``model.vocoder_path`` for a folder without the Vocos files and for a hub download with no hub."""

from __future__ import annotations

import pytest

from espnet3_prefect.config.vocoder import F5TTS_INFERENCE, check_vocoder, hub_unreachable
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.pipeline.precheck import check_inputs_before_start


def f5(**model):
    return {"model": {"_target_": F5TTS_INFERENCE, "train_config": "conf/training.yaml", **model}}


def vocos_folder(path):
    path.mkdir()
    (path / "config.yaml").write_text("feature_extractor: {}\n")
    (path / "pytorch_model.bin").write_bytes(b"\0")
    return path


def test_a_complete_folder_passes(tmp_path):
    check_vocoder(f5(vocoder_path=str(vocos_folder(tmp_path / "vocoder"))))


def test_a_relative_folder_is_read_from_recipe_dir(tmp_path):
    vocos_folder(tmp_path / "vocoder")
    check_vocoder({**f5(vocoder_path="vocoder"), "recipe_dir": str(tmp_path)})


@pytest.mark.parametrize("present", [(), ("config.yaml",), ("pytorch_model.bin",)])
def test_a_folder_without_the_vocos_files_is_one_line_naming_the_key(tmp_path, present):
    folder = tmp_path / "vocoder"
    folder.mkdir()
    for name in present:
        (folder / name).write_text("x")
    with pytest.raises(ConfigError) as err:
        check_vocoder(f5(vocoder_path=str(folder)))
    message = str(err.value)
    assert message.startswith("model.vocoder_path: ") and "\n" not in message
    missing = {"config.yaml", "pytorch_model.bin"} - set(present)
    assert all(name in message for name in missing)


def test_unset_with_the_hub_switched_off_is_one_line_naming_the_key(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    try:  # huggingface_hub reads its cache folder at import; this one is empty
        import huggingface_hub.constants as hub_constants

        monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    except ImportError:
        pass
    with pytest.raises(ConfigError) as err:
        check_vocoder(f5(vocoder_path=None))
    message = str(err.value)
    assert message.startswith("model.vocoder_path: unset") and "HF_HUB_OFFLINE" in message and "\n" not in message


def test_an_unreachable_hub_is_named(monkeypatch):
    """A closed port on this machine stands for a hub without network (connection refused at once)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    assert f"127.0.0.1:{port}" in hub_unreachable()


def test_other_models_are_not_checked():
    check_vocoder({"model": {"_target_": "espnet2.bin.asr_inference.Speech2Text"}})
    check_vocoder({"model": None})


def test_the_driver_precheck_runs_it_first(tmp_path):
    """Before the data hook and the datasets (an empty stage list: nothing else to check)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({**f5(vocoder_path=str(tmp_path / "missing")), "recipe_dir": "."})
    with pytest.raises(ConfigError, match=r"^model\.vocoder_path: "):
        check_inputs_before_start(cfg, [])
