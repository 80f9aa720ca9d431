"""Task ``write-done-marker``: the last write of a shard; only then does the shard count as done."""

from __future__ import annotations

from prefect import task

from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.marker import shard_files, write_marker


@task(name="write-done-marker", task_run_name="write-done-marker-{result[index]}", retries=2,
      retry_delay_seconds=1)
def write_done_marker(stage, result: dict) -> dict:
    """Check the shard's files still match what run-shard wrote, then write ``split.N/done``."""
    shard_dir = stage.shard_dir(result["index"])
    now = shard_files(shard_dir)
    if now != result["files"]:
        raise Espnet3PrefectError(f"{shard_dir}: files changed between run-shard and write-done-marker")
    record = {key: result[key] for key in ("test_set", "index", "start", "stop", "items", "failed", "seconds", "files")}
    from prefect.runtime import flow_run

    write_marker(shard_dir, {**record, "fingerprint": stage.fingerprint, "identity": stage.identity,
                             "flow_run_id": str(flow_run.id) if flow_run.id else None})
    return record
