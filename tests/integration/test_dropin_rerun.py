"""The drop-in ``espnet3_prefect.infer(config)`` answers a finished stage without a flow run, as the
command line does; any change to the config is work again."""

from __future__ import annotations

import logging
from datetime import datetime, timezone

import pytest
from omegaconf import OmegaConf

from tests.conftest import toy_config

pytestmark = pytest.mark.slow


def _infer_runs(inference_dir: str, since) -> list:
    """The ``infer`` flow runs of this config started since ``since``: the session's server also holds
    other tests' runs (a detached deployment run still finishing, a schedule's future runs)."""
    from prefect import get_client
    from prefect.client.schemas.filters import (FlowFilter, FlowFilterName, FlowRunFilter,
                                                FlowRunFilterStartTime)

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["infer"])),
                                     flow_run_filter=FlowRunFilter(start_time=FlowRunFilterStartTime(after_=since)))
    return [r for r in runs if isinstance(r.parameters.get("config"), dict)
            and r.parameters["config"].get("inference_dir") == inference_dir]


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_dropin_infer_starts_no_flow_run_for_a_finished_stage(prefect_server, tmp_path):
    from espnet3_prefect import infer

    config = OmegaConf.create(toy_config(tmp_path, n=6, n_workers=1, num_shards=2))
    inference_dir, since = config.inference_dir, datetime.now(timezone.utc)
    assert infer(config) is None
    assert len(_infer_runs(inference_dir, since)) == 1
    scp = tmp_path / "inference/test_a/y.scp"
    written = scp.read_bytes()

    # setLevel, not an assignment to .level: it also clears the logger's cached isEnabledFor answers
    # (an earlier INFO record in this process, at the default WARNING, cached "no").
    logger, lines = logging.getLogger("espnet3_prefect"), _Lines()
    logger.info("not shown: the default level is WARNING")  # as earlier tests in a full run leave it
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    try:
        assert infer(config) is None
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    assert len(_infer_runs(inference_dir, since)) == 1  # answered here: no flow run, no cluster
    assert any("nothing to run, every test set is done and verified" in line for line in lines.lines), lines.lines
    assert scp.read_bytes() == written

    (tmp_path / "inference/test_a/split.1/done").unlink()  # a shard no longer done: work again
    assert infer(config) is None
    assert len(_infer_runs(inference_dir, since)) == 2
    assert scp.read_bytes() == written
