"""Task ``merge-<test>``: the runner's own ``merge(shard_dirs)``, on the driver, once every shard is done.

Called directly from the flow (not submitted to Dask), so it runs where ESPnet3 runs it, on the
runner instance the stage built. Skipped items (``on_error: skip``) are gathered into
``failures.jsonl`` first; above ``runner.max_failed_ratio`` the stage fails and nothing is merged.
"""

from __future__ import annotations

import time

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.pipeline.layout import DONE_NAME, FAILURES_NAME
from espnet3_prefect.pipeline.marker import read_marker
from espnet3_prefect.pipeline.merge import concat_files, snapshot, write_merged_record, written_since


@task(name="merge", task_run_name="merge-{stage.test_set}", cache_policy=NO_CACHE, retries=0)
def merge_shards(stage, shards: list, n_items: int) -> dict:
    """Merge ``shards`` (in plan order) with ``stage.runner.merge``; return ``{output name: path}``."""
    logger = get_run_logger()
    layout = stage.layout
    dirs, failed = ready_to_merge(stage, shards, n_items, logger)
    started = time.perf_counter()
    before = snapshot(layout.output_dir)
    stage.runner.merge(dirs)
    outputs = written_since(layout.output_dir, before)
    record = write_merged_record(layout, {
        "fingerprint": stage.work.fingerprint, "identity_fingerprint": stage.identity_fingerprint,
        "n_items": n_items, "num_shards": len(dirs), "failed": failed}, outputs)
    logger.info("merged %d shards into %s in %.2f s: %s", len(dirs), layout.output_dir,
                time.perf_counter() - started, ", ".join(record["outputs"]) or "no files")
    return {**record["outputs"], **({"failures": str(layout.failures)} if failed else {})}


def ready_to_merge(stage, shards: list, n_items: int, logger, what: str | None = None) -> tuple[list, int]:
    """The shard folders to merge, in plan order, and the count of skipped items; fails when a shard
    is not done or too many items were skipped (``failures.jsonl`` gathered first)."""
    what = what or f"test set {stage.test_set!r}"
    layout = stage.layout
    dirs = [layout.shard_dir(s.index) for s in shards]
    missing = [d.name for d in dirs if not (d / DONE_NAME).is_file()]
    if missing:
        raise Espnet3PrefectError(f"{what}: cannot merge, not done: {', '.join(missing[:10])}")
    records = [read_marker(d) or {} for d in dirs]
    failed = sum(r.get("failed", 0) for r in records)
    _gather_failures(layout, dirs)
    if failed:
        logger.warning("%s: %d of %d items failed and were skipped; listed in %s", stage.test_set, failed,
                       n_items, layout.failures)
    if n_items and failed / n_items > stage.max_failed_ratio:
        raise Espnet3PrefectError(
            f"{what}: {failed} of {n_items} items failed ({100 * failed / n_items:.1f}%), above "
            f"runner.max_failed_ratio {stage.max_failed_ratio}; see {layout.failures}")
    return dirs, failed


def _gather_failures(layout, dirs) -> None:
    """Concatenate the shards' failure lists into ``<test>/failures.jsonl`` (or remove a stale one)."""
    parts = [d / FAILURES_NAME for d in dirs if (d / FAILURES_NAME).is_file()]
    if parts:
        concat_files(parts, layout.failures)
    else:
        layout.failures.unlink(missing_ok=True)
