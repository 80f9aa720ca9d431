"""One run plan per run: every front door builds it once and hands it to the flow, so the driver
builds each test set's dataset once (before: the input check, then the flow's sizing, and the config
validated twice behind a process-wide cache). Counted on the driver: builds in this process's main
thread (the workers build theirs in their own processes)."""

from __future__ import annotations

import os

import pytest
from omegaconf import OmegaConf

from tests.conftest import toy_config, write_yaml
from tests.helpers.api_reads import newest_flow_runs

pytestmark = pytest.mark.slow


def _config(tmp_path) -> dict:
    cfg = toy_config(tmp_path, n=6, n_workers=1, num_shards=2)
    cfg["toy"]["dataset_log"] = str(tmp_path / "datasets.log")
    cfg["provider"]["_target_"] = "tests.helpers.toy.DatasetCountingProvider"
    return cfg


def _driver_builds(tmp_path) -> int:
    log = tmp_path / "datasets.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return sum(line == f"dataset {os.getpid()} MainThread" for line in lines)


def test_the_command_line_builds_each_dataset_once_on_the_driver(prefect_server, tmp_path):
    from espnet3_prefect.cli import main

    path = write_yaml(tmp_path / "inference.yaml", _config(tmp_path))
    assert main(["infer", "--config", str(path)]) == 0
    assert (tmp_path / "inference/test_a/y.scp").is_file()
    assert _driver_builds(tmp_path) == 1  # checked before the server started, then sized by the flow
    assert main(["infer", "--config", str(path)]) == 0  # done: answered without a server
    assert _driver_builds(tmp_path) == 2


def test_the_dropin_builds_each_dataset_once_on_the_driver(prefect_server, tmp_path):
    from espnet3_prefect import infer

    assert infer(OmegaConf.create(_config(tmp_path))) is None
    assert (tmp_path / "inference/test_a/y.scp").is_file()
    assert _driver_builds(tmp_path) == 1


def test_the_plan_is_recorded_by_name_and_the_config_in_full(prefect_server, tmp_path):
    """The flow run's parameters keep the config (what a re-run needs); the plan shows as a name."""
    from prefect import get_client

    from espnet3_prefect.config.load import load_config
    from espnet3_prefect.flows.infer import infer
    from espnet3_prefect.pipeline.run_plan import plan_run

    path = write_yaml(tmp_path / "inference.yaml", _config(tmp_path))
    plan = plan_run(load_config([str(path)]))
    infer(config=[str(path)], plan=plan)
    with get_client(sync_client=True) as client:
        [run] = [r for r in newest_flow_runs(client) if r.parameters.get("config") == [str(path)]]
    assert run.parameters["plan"] == "<RunPlan>"
    assert _driver_builds(tmp_path) == 1  # the flow sized the dataset once; nothing checked it before


def test_evaluate_from_the_command_line_builds_the_dataset_once_on_the_driver(prefect_server, tmp_path):
    """The command line plans the evaluation (both configs, the model's identity, infer's run plan)
    before the server starts and hands that plan to the flow ``evaluate``, which hands infer's plan
    to its infer subflow: one dataset build on the driver (before the run plan: three)."""
    from espnet3_prefect.cli import main
    from tests.helpers.wordrecipe import word_config

    (tmp_path / "model.ckpt").write_text("0\n")
    cfg = word_config(tmp_path, n=8)
    cfg["dataset"]["_target_"] = "tests.helpers.wordrecipe.CountingWordOrganizer"
    cfg["dataset"]["log"] = str(tmp_path / "datasets.log")
    icfg = write_yaml(tmp_path / "inference.yaml", cfg)
    wer = "espnet3.systems.esp2_asr.metrics.wer.WER"
    mcfg = write_yaml(
        tmp_path / "metrics.yaml", {"metrics": [{"metric": {"_target_": wer}, "inputs": {"ref": "ref", "hyp": "hyp"}}]}
    )
    assert main(["evaluate", "--config", str(icfg), "--metrics-config", str(mcfg)]) == 0
    assert (tmp_path / "inference/evaluate_history.jsonl").is_file()
    assert _driver_builds(tmp_path) == 1


def test_a_dataset_whose_module_workers_cannot_import_stays_on_the_driver(prefect_server, tmp_path):
    """Prefect sends a flow run's parameters with every task; the plan holds the driver's datasets.
    A dataset class from a module loaded under a synthetic name (as ESPnet3 loads a recipe's local
    dataset/) killed every worker as it unpickled its first task. The plan pickles to nothing."""
    import pickle

    from espnet3_prefect import infer
    from espnet3_prefect.config.load import load_config
    from espnet3_prefect.pipeline.run_plan import plan_run

    cfg = _config(tmp_path)
    cfg["provider"]["_target_"] = "tests.helpers.toy.SyntheticModuleProvider"
    plan = plan_run(load_config([str(write_yaml(tmp_path / "inference.yaml", cfg))]))
    plan.check_inputs()  # the dataset built on the driver, kept in the plan
    assert type(plan.dataset(plan.stages[0])).__module__ == "_e3p_synthetic_dataset"
    assert len(pickle.dumps(plan)) < 200 and pickle.loads(pickle.dumps(plan)) is None
    assert infer(OmegaConf.create(cfg)) is None  # before the fix: no worker left, the run hung
    assert (tmp_path / "inference/test_a/y.scp").read_text().count("\n") == 6
