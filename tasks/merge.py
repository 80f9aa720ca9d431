"""Task ``merge``: combine shard outputs into ``<inference_dir>/<test_set>/`` in dataset order."""

from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task

from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.marker import MARKER_NAME


@task(name="merge", task_run_name="merge-{stage.test_set}", retries=1, retry_delay_seconds=1)
def merge_shards(stage, shard_indices: list[int]) -> dict:
    """Call ``runner.merge`` with the shard folders in plan order; every one must be marked done."""
    dirs = [stage.shard_dir(i) for i in shard_indices]
    missing = [d.name for d in dirs if not (d / MARKER_NAME).is_file()]
    if missing:
        raise Espnet3PrefectError(f"test set {stage.test_set!r}: cannot merge, not done: {', '.join(missing[:10])}")
    outputs = stage.runner.merge([Path(d) for d in dirs]) or {}
    get_run_logger().info("merged %d shards into %s", len(dirs), stage.out_dir)
    return {str(k): str(v) for k, v in outputs.items()} if isinstance(outputs, dict) else {}
