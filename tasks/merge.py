"""Task ``merge``: combine shard outputs into ``<inference_dir>/<test_set>/`` in dataset order."""

from __future__ import annotations

import json
from pathlib import Path

from prefect import get_run_logger, task

from espnet3_prefect.atomic import atomic_write_text, file_digest
from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.marker import MARKER_NAME, read_marker
from espnet3_prefect.merge import MERGED_MANIFEST, concat_files
from espnet3_prefect.shard import FAILURES_NAME


@task(name="merge", task_run_name="merge-{stage.test_set}", retries=1, retry_delay_seconds=1)
def merge_shards(stage, shard_indices: list[int], n_items: int) -> dict:
    """Call ``runner.merge`` with the shard folders in plan order; every one must be marked done.

    Skipped items (``on_error: skip``) are gathered into ``failures.jsonl`` first; above
    ``runner.max_failed_ratio`` the stage fails and no merged output is written.
    """
    logger = get_run_logger()
    dirs = [stage.shard_dir(i) for i in shard_indices]
    missing = [d.name for d in dirs if not (d / MARKER_NAME).is_file()]
    if missing:
        raise Espnet3PrefectError(f"test set {stage.test_set!r}: cannot merge, not done: {', '.join(missing[:10])}")
    failed, items = _gather_failures(stage, dirs)
    if failed:
        logger.warning("%s: %d of %d items failed and were skipped; listed in %s", stage.test_set, failed,
                       items, stage.out_dir / FAILURES_NAME)
    if items and failed / items > stage.max_failed_ratio:
        raise Espnet3PrefectError(
            f"test set {stage.test_set!r}: {failed} of {items} items failed ({100 * failed / items:.1f}%), above "
            f"runner.max_failed_ratio {stage.max_failed_ratio}; see {stage.out_dir / FAILURES_NAME}")
    outputs = stage.runner.merge([Path(d) for d in dirs]) or {}
    outputs = {str(k): str(v) for k, v in outputs.items()} if isinstance(outputs, dict) else {}
    digests = {name: file_digest(Path(path)) for name, path in outputs.items() if Path(path).is_file()}
    atomic_write_text(stage.out_dir / MERGED_MANIFEST, json.dumps({
        "fingerprint": stage.fingerprint, "identity_fingerprint": stage.identity_fingerprint,
        "n_items": n_items, "num_shards": len(dirs), "outputs": outputs, "digests": digests,
        "failed": failed}, sort_keys=True))
    logger.info("merged %d shards into %s", len(dirs), stage.out_dir)
    return {**outputs, **({"failures": str(stage.out_dir / FAILURES_NAME)} if failed else {})}


def _gather_failures(stage, dirs: list[Path]) -> tuple[int, int]:
    """Concatenate shard failure lists into ``<test>/failures.jsonl``; return (failed, items)."""
    records = [read_marker(d) or {} for d in dirs]
    failed = sum(r.get("failed", 0) for r in records)
    items = sum(r.get("items", 0) for r in records)
    target = stage.out_dir / FAILURES_NAME
    parts = [d / FAILURES_NAME for d in dirs if (d / FAILURES_NAME).is_file()]
    if parts:
        concat_files(parts, target)
    else:
        target.unlink(missing_ok=True)
    return failed, items
