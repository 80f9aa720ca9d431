"""Task ``write-done-marker``: the last write of a shard; only then does the shard count as done.

One task writes the markers of every shard that finished since the previous marker task, so a
run costs a few marker tasks rather than one per shard (each task is an API round trip or more).
"""

from __future__ import annotations

from prefect import task

from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.marker import shard_files, write_marker


def marker_label(results: list[dict]) -> str:
    """``3`` or ``3,5,6``: the shards a marker task covers (for its task run name)."""
    return ",".join(str(r["index"]) for r in results)


@task(name="write-done-marker", task_run_name="write-done-marker-{label}", retries=2, retry_delay_seconds=1)
def write_done_marker(stage, results: list[dict], label: str = "") -> list[dict]:
    """Check each shard's files still match what run-shard wrote, then write its ``split.N/done``."""
    from prefect.runtime import flow_run

    records = []
    for result in results:
        shard_dir = stage.shard_dir(result["index"])
        if shard_files(shard_dir) != result["files"]:
            raise Espnet3PrefectError(f"{shard_dir}: files changed between run-shard and write-done-marker")
        record = {key: result[key] for key in ("test_set", "index", "start", "stop", "items", "failed", "seconds", "files")}
        write_marker(shard_dir, {**record, "fingerprint": stage.fingerprint, "identity": stage.identity,
                                 "flow_run_id": str(flow_run.id) if flow_run.id else None})
        records.append(record)
    return records
