"""Which of a stage's modules the fork server of the local workers imports (flows/workers.py)."""

from __future__ import annotations

import sys
import types

from omegaconf import OmegaConf

from espnet3_prefect.flows.workers import stage_modules


def _stage(config):
    return types.SimpleNamespace(config=OmegaConf.create(config), runner=None, builder=None)


def test_the_stages_imported_targets_in_order_once():
    config = {
        "model": {"_target_": "json.decoder.JSONDecoder", "x": "${model._target_}"},
        "dataset": {"_target_": "email.message.Message.as_string"},  # a method: its module
        "items": [{"_target_": "json.decoder.JSONDecoder"}, {"_target_": "not_imported_anywhere.Thing"}],
    }
    import email.message  # noqa: F401 - imported, as the driver's config check would have

    assert stage_modules([_stage(config), _stage(config)]) == ("json.decoder", "email.message")


def test_none_where_the_driver_sees_a_gpu(monkeypatch):
    """A GPU box: modules that touch CUDA on import must not be imported in the fork server (a fake
    ``torch``: no GPU here)."""
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(is_available=lambda: True))
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert stage_modules([_stage({"model": {"_target_": "json.decoder.JSONDecoder"}})]) == ()
    fake.cuda.is_available = lambda: False
    assert stage_modules([_stage({"model": {"_target_": "json.decoder.JSONDecoder"}})]) == ("json.decoder",)


def test_a_runner_stage_names_its_runner_its_provider_and_the_providers_targets_and_task():
    """``run-runner`` (collect_stats): the stage has no config; the runner's provider holds it, with
    ESPnet3's ``task`` class path beside the ``_target_``s."""
    import email.message  # noqa: F401 - imported, as the driver would have
    import json.encoder  # noqa: F401

    class Provider:
        __module__ = "email.message"

        def __init__(self):
            self.config = OmegaConf.create(
                {"task": "json.encoder.JSONEncoder", "dataset_config": {"_target_": "json.decoder.JSONDecoder"}}
            )

    class Runner:
        __module__ = "json.scanner"

        def __init__(self):
            self.provider = Provider()

    stage = types.SimpleNamespace(config=None, runner=Runner(), builder=None)
    import json.scanner  # noqa: F401

    assert stage_modules([stage]) == ("json.encoder", "json.decoder", "json.scanner", "email.message")
