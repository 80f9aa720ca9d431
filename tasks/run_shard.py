"""Task ``run-shard``: one coarse shard of forward() calls, cached across flow runs."""

from __future__ import annotations

from prefect import get_run_logger, task

from espnet3_prefect.marker import check_marker, read_marker
from espnet3_prefect.plan import Shard
from espnet3_prefect.shard import execute_shard
from espnet3_prefect.worker_env import get_env

from .build_env import _not_input_error


def shard_cache_key(context, parameters) -> str:
    """Cache key: config+code fingerprint, test set and the shard's range (no run id).

    So a re-run of the same stage hits the cache; any change in what the shard would compute
    misses it. The flow trusts a hit only after checking the shard's done marker and files.
    """
    stage, shard = parameters["stage"], parameters["shard"]
    return f"e3p-{stage.fingerprint[:32]}-{stage.test_set}-{shard['index']}-{shard['start']}-{shard['stop']}"


def marker_expectation(stage, shard: dict) -> dict:
    return {"fingerprint": stage.fingerprint, "identity": stage.identity,
            "start": shard["start"], "stop": shard["stop"]}


@task(name="run-shard", task_run_name="run-shard-{shard[index]}", cache_key_fn=shard_cache_key,
      persist_result=True, retry_condition_fn=_not_input_error)
def run_shard(stage, shard: dict, force: bool = False) -> dict:
    """Run one shard and return its summary (counts, seconds, file checksums; never the data).

    Unless ``force``, a shard whose done marker and files are intact is not recomputed.
    """
    from prefect.runtime import flow_run

    logger = get_run_logger()
    shard_dir = stage.shard_dir(shard["index"])
    marker = read_marker(shard_dir)
    # Forced shards distrust earlier runs' markers, but not one written by this very flow run:
    # Dask re-runs a finished task whose result died with its worker (prefect#15442).
    trusted = not force or (marker or {}).get("flow_run_id") == str(flow_run.id)
    if trusted and marker and check_marker(shard_dir, marker_expectation(stage, shard)) is None:
        logger.info("split.%d: done marker intact, nothing to do", shard["index"])
        return {**marker, "reused": True}
    env = get_env(stage.env_key, stage.runner.provider)
    result = execute_shard(stage.runner, env, Shard(**shard), stage.out_dir, on_error=stage.on_error)
    logger.info("split.%d: %d items [%d, %d) in %.2f s", shard["index"], result["items"],
                shard["start"], shard["stop"], result["seconds"])
    if result["failed"]:
        logger.warning("split.%d: %d item(s) failed and were skipped (on_error: skip); see %s/failures.jsonl",
                       shard["index"], result["failed"], shard_dir)
    return {**result, "reused": False}
