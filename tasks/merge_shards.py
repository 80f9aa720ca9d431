"""Task ``merge``: the runner's own ``merge(shard_dirs)``, on the driver, once every shard is done
(:func:`espnet3_prefect.pipeline.merge.merge_stage`).

Called directly from the flow (not submitted to Dask), so it runs where ESPnet3 runs it, on the
runner instance the stage built. Skipped items (``on_error: skip``) are gathered into
``failures.jsonl`` first; above ``runner.max_failed_ratio`` the stage fails and nothing is merged.
"""

from __future__ import annotations

from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from espnet3_prefect.pipeline.merge import merge_stage


@task(name="merge", task_run_name="merge-{stage.test_set}", cache_policy=NO_CACHE, retries=0)
def merge_shards(
    stage, shards: list, n_items: int, record: bool = True, what: str | None = None
) -> tuple[Any, dict[str, str]]:
    """Merge ``shards`` (in plan order) with ``stage.runner.merge``; returns what it returned and the
    merged outputs by name (``record``: the infer stage's commit record is written)."""
    return merge_stage(stage, shards, n_items, record=record, log=get_run_logger(), what=what)
