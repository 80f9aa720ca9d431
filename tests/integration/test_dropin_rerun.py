"""The drop-ins ``espnet3_prefect.infer(config)`` and ``measure(metrics_config)`` answer a finished
stage without a flow run, as the command line does; any change to the config or the inputs is work again."""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime

import pytest
from omegaconf import OmegaConf

from tests.conftest import toy_config

pytestmark = pytest.mark.slow


def _infer_runs(inference_dir: str, since, flow: str = "infer") -> list:
    """The ``flow`` runs of this config started since ``since``: the session's server also holds
    other tests' runs (a detached deployment run still finishing, a schedule's future runs)."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterStartTime

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow])),
            flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since)),
        )
    return [
        r
        for r in runs
        if isinstance(r.parameters.get("config"), dict) and r.parameters["config"].get("inference_dir") == inference_dir
    ]


@contextlib.contextmanager
def _logged():
    """The ``espnet3_prefect`` logger's INFO lines while the block runs."""
    logger, lines = logging.getLogger("espnet3_prefect"), _Lines()
    logger.info("not shown: the default level is WARNING")  # as earlier tests in a full run leave it
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    try:
        yield lines
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_dropin_infer_starts_no_flow_run_for_a_finished_stage(prefect_server, tmp_path):
    from espnet3_prefect import infer

    config = OmegaConf.create(toy_config(tmp_path, n=6, n_workers=1, num_shards=2))
    inference_dir, since = config.inference_dir, datetime.now(UTC)
    assert infer(config) is None
    assert len(_infer_runs(inference_dir, since)) == 1
    scp = tmp_path / "inference/test_a/y.scp"
    written = scp.read_bytes()

    # setLevel, not an assignment to .level: it also clears the logger's cached isEnabledFor answers
    # (an earlier INFO record in this process, at the default WARNING, cached "no").
    with _logged() as lines:
        assert infer(config) is None
    assert len(_infer_runs(inference_dir, since)) == 1  # answered here: no flow run, no cluster
    assert any("nothing to run, every test set is done and verified" in line for line in lines.lines), lines.lines
    assert scp.read_bytes() == written

    (tmp_path / "inference/test_a/split.1/done").unlink()  # a shard no longer done: work again
    assert infer(config) is None
    assert len(_infer_runs(inference_dir, since)) == 2
    assert scp.read_bytes() == written


def test_dropin_measure_starts_no_flow_run_when_nothing_changed(prefect_server, tmp_path):
    from espnet3_prefect import measure

    inference_dir = tmp_path / "inference"
    for test_set, ref, hyp in (("valid", "u1 a b c\n", "u1 a x c\n"), ("test", "v1 d e\n", "v1 d e\n")):
        (inference_dir / test_set).mkdir(parents=True)
        (inference_dir / test_set / "ref.scp").write_text(ref)
        (inference_dir / test_set / "hyp.scp").write_text(hyp)
    config = OmegaConf.create(
        {
            "inference_dir": str(inference_dir),
            "metrics": [
                {
                    "metric": {"_target_": "espnet3.systems.esp2_asr.metrics.wer.WER"},
                    "inputs": {"ref": "ref", "hyp": "hyp"},
                }
            ],
        }
    )
    since = datetime.now(UTC)
    first = measure(config)
    written = (inference_dir / "metrics.json").read_bytes()
    assert list(next(iter(first.values()))) == ["test", "valid"]  # upstream's order: folders sorted
    assert len(_infer_runs(str(inference_dir), since, "metrics")) == 1

    with _logged() as lines:
        assert measure(config) == first
    assert len(_infer_runs(str(inference_dir), since, "metrics")) == 1  # answered here: no flow run
    assert any("measure: nothing to run" in line for line in lines.lines), lines.lines
    assert (inference_dir / "metrics.json").read_bytes() == written

    (inference_dir / "valid" / "hyp.scp").write_text("u1 a b c\n")  # a new infer output: scored again
    again = measure(config)
    assert len(_infer_runs(str(inference_dir), since, "metrics")) == 2
    assert next(iter(again.values()))["valid"] != next(iter(first.values()))["valid"]


def test_dropin_measure_with_dataset_inputs_reruns_only_when_the_dataset_changed(prefect_server, tmp_path):
    """A ``dataset:`` reference is read through the inference config: vouched for by infer's completeness
    check (same dataset as at its merge), so an unchanged stage answers here, a changed dataset scores again."""
    from espnet3_prefect import infer, measure
    from tests.helpers.wordrecipe import word_config

    (tmp_path / "model.ckpt").write_text("0\n")
    icfg = OmegaConf.create(word_config(tmp_path, n=6))
    mcfg = OmegaConf.create(
        {
            "inference_dir": icfg.inference_dir,
            "metrics": [
                {
                    "metric": {"_target_": "espnet3.systems.esp2_asr.metrics.wer.WER"},
                    "inputs": {"ref": "dataset:text", "hyp": "hyp"},
                }
            ],
        }
    )
    since = datetime.now(UTC)
    infer(icfg)
    first = measure(mcfg, inference_config=icfg)
    assert measure(mcfg, inference_config=icfg) == first
    assert len(_infer_runs(icfg.inference_dir, since, "metrics")) == 1  # the second answered here

    icfg.dataset.test[0].n = 5  # another dataset: infer has work, so measure runs again
    measure(mcfg, inference_config=icfg)
    assert len(_infer_runs(icfg.inference_dir, since, "metrics")) == 2
