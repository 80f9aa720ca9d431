"""``runner(indices)`` in this process: the pipeline driver's steps without Dask or Prefect (ESPnet3's
local mode, used when no ``parallel`` block is registered). The same plan, done markers and merge as
the flow ``run-runner``, so either one resumes the other's shards.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from espnet3_prefect.pipeline.driver import drive_stage
from espnet3_prefect.pipeline.duration import caveat
from espnet3_prefect.pipeline.merge import merge_stage
from espnet3_prefect.pipeline.plan import Shard
from espnet3_prefect.pipeline.report import add_timing, empty_timing
from espnet3_prefect.pipeline.runner_job import prepare_job
from espnet3_prefect.pipeline.shard import process_shard
from espnet3_prefect.pipeline.stage import Stage
from espnet3_prefect.pipeline.summary import ShardOutcome

log = logging.getLogger("espnet3_prefect.in_process")


class InProcessExecutor:
    """The driver's steps in this process: the env built once from ``provider.build_env_local()``, the
    shards run one after the other, the runner's own ``merge``."""

    records_merge = False

    def __init__(self, runner: Any):
        self.runner = runner
        self.log = log
        self.env: dict | None = None

    def build_env(self, stage: Stage) -> dict:
        provider = getattr(self.runner, "provider", None)
        env = dict(provider.build_env_local()) if provider is not None else {}
        env.setdefault("output_dir", str(self.runner.output_dir))
        if stage.layout.shard_subdir:
            env.setdefault("shard_subdir", stage.layout.shard_subdir)
        self.env = env
        return {"workers": 1}

    def run_shards(self, stage: Stage, shards: list[Shard]) -> ShardOutcome:
        work = stage.work
        outcome = ShardOutcome(timing=empty_timing())
        started = time.perf_counter()
        for shard in shards:
            result = process_shard(
                work.runner_cls,
                shard,
                self.env,
                stage.layout,
                on_error=work.on_error,
                idx_key=work.idx_key,
                prefetch=work.prefetch,
                marker={"fingerprint": work.fingerprint, "identity": work.identity},
            )
            outcome.run += 1
            outcome.failed += result["failed"]
            add_timing(outcome.timing, result)
        outcome.timing["wall_s"] = round(time.perf_counter() - started, 4)
        return outcome

    def merge(self, stage: Stage, shards: list[Shard], n_items: int) -> tuple[Any, dict[str, str]]:
        return merge_stage(stage, shards, n_items, record=False, log=self.log, what=stage.test_set)

    def forget_env(self, stage: Stage) -> None:
        self.env = None


def run_in_process(runner: Any, indices: Iterable[int]) -> Any:
    """Plan ``indices`` (batched first), run the shards not already done, return ``runner.merge(...)``."""
    job = prepare_job(runner, indices, None)
    if job.stage.work.max_duration is not None:
        logging.getLogger("espnet3_prefect").warning(caveat(job.stage.work.max_duration, whole_test_set=False))
    _, merged = drive_stage(job.stage, InProcessExecutor(runner), shards=job.shards)
    return merged
