"""The drop-in ``espnet3_prefect.infer(config)`` answers a finished stage without a flow run, as the
command line does; any change to the config is work again."""

from __future__ import annotations

import logging

import pytest
from omegaconf import OmegaConf

from tests.conftest import toy_config

pytestmark = pytest.mark.slow


def _infer_runs() -> list:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["infer"])))


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_dropin_infer_starts_no_flow_run_for_a_finished_stage(prefect_server, tmp_path):
    from espnet3_prefect import infer

    config = OmegaConf.create(toy_config(tmp_path, n=6, n_workers=1, num_shards=2))
    before = len(_infer_runs())
    assert infer(config) is None
    assert len(_infer_runs()) == before + 1
    scp = tmp_path / "inference/test_a/y.scp"
    written = scp.read_bytes()

    logger, lines = logging.getLogger("espnet3_prefect"), _Lines()
    level, logger.level = logger.level, logging.INFO
    logger.addHandler(lines)
    try:
        assert infer(config) is None
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    assert len(_infer_runs()) == before + 1  # answered here: no flow run, no cluster
    assert any("nothing to run, every test set is done and verified" in line for line in lines.lines), lines.lines
    assert scp.read_bytes() == written

    (tmp_path / "inference/test_a/split.1/done").unlink()  # a shard no longer done: work again
    assert infer(config) is None
    assert len(_infer_runs()) == before + 2
    assert scp.read_bytes() == written
