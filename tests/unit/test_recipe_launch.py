"""The recipe entry points' own logic (the real ESPnet3 recipe runs in tests/realespnet/)."""

from __future__ import annotations

import importlib.util

import pytest

from espnet3_prefect.cli import main
from espnet3_prefect.launch import PREFECT_STAGES, on_prefect
from tests.conftest import write_yaml

NO_ESPNET3 = pytest.mark.skipif(
    importlib.util.find_spec("espnet3") is not None,
    reason="espnet3 is installed here: the errors for its absence are checked in .venv",
)


class RecipeSystem:
    """Stands for an ESPnet3 system class (stage methods, configs)."""

    def infer(self):
        return "espnet3's infer"

    def train(self):
        return "espnet3's train"


def test_on_prefect_takes_over_the_parallel_stages_only_and_keeps_the_class_identity():
    system = on_prefect(RecipeSystem)
    assert issubclass(system, RecipeSystem) and system is not RecipeSystem
    assert (system.__name__, system.__module__, system.__qualname__) == (
        "RecipeSystem",
        RecipeSystem.__module__,
        RecipeSystem.__qualname__,
    )  # same egs3.TEMPLATE lookup
    for stage in PREFECT_STAGES:
        assert getattr(system, stage) is not getattr(RecipeSystem, stage, None), stage
    assert system.train is RecipeSystem.train
    assert on_prefect(system) is system
    with pytest.raises(TypeError, match="stage 'infer' takes no arguments"):
        system().infer("extra")


@NO_ESPNET3
def test_training_config_outside_a_recipe_is_a_one_line_error(tmp_path, capsys):
    config = write_yaml(tmp_path / "inference.yaml", {"inference_dir": str(tmp_path / "out")})
    assert main(["infer", "--config", str(config), "--training-config", str(config)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --training-config: only for an ESPnet3 recipe") and "\n" not in err


@NO_ESPNET3
def test_run_names_the_system_it_needs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--stages", "infer", "--inference_config", "conf/inference.yaml"]) == 2
    err = capsys.readouterr().err.strip()
    assert "is not an ESPnet3 system" in err and "--system" in err and "\n" not in err


def test_arguments_only_run_passes_through_are_refused_elsewhere(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["infer", "--config", "c.yaml", "--stages", "infer"])
    assert exit_info.value.code == 2 and "unrecognized arguments: --stages" in capsys.readouterr().err
