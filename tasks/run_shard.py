"""Task ``run-shard``: one coarse shard of forward() calls. Submitted only for a shard whose done marker
says it must run (:func:`espnet3_prefect.pipeline.resume.shards_to_redo`): the marker is the one record
of a finished shard, so the task has no Prefect cache key and persists no result."""

from __future__ import annotations

from prefect import get_run_logger, task

from espnet3_prefect.disk.marker import check_marker, read_marker
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.pipeline.env import get_env
from espnet3_prefect.pipeline.plan import Shard
from espnet3_prefect.pipeline.report import quiet_console
from espnet3_prefect.pipeline.shard import process_shard
from espnet3_prefect.tasks.build_env import retry_if_it_can_help


def _worker_builder(work):
    """The env builder the ``build-env`` task registered on this worker (shipped once, not per task)."""
    from distributed import get_worker

    plugin = get_worker().plugins.get(f"espnet3-env-{work.env_key}")
    if plugin is None:
        raise ConfigError(f"test set {work.test_set!r}: no env plugin on this worker (build-env did not run)")
    return plugin.builder


def _same_folder(work, env: dict) -> None:
    """A relative ``inference_dir`` names the same folder only on workers that run where the flow
    started (local, SLURM, SGE, OAR workers do; an SSH or Kubernetes worker does not)."""
    import os

    if not os.path.isabs(str(env.get("output_dir", "/"))) and work.cwd and os.getcwd() != work.cwd:
        raise ConfigError(
            f"inference_dir: {env['output_dir']!r} is relative, and this worker runs in {os.getcwd()}, "
            f"not in {work.cwd} where the run started; set an absolute inference_dir"
        )


@task(
    name="run-shard", task_run_name="run-shard-{work.test_set}-{shard[index]}", retry_condition_fn=retry_if_it_can_help
)
def run_shard(work, shard: dict) -> dict:
    """Run one shard and mark it done; return its summary (counts and seconds, never the data).

    The driver decided it runs, so an earlier run's marker is not trusted; one this very flow run wrote
    is (Dask runs a finished task again when its result died with its worker, prefect#15442): then the
    shard is not recomputed and the marker's record comes back with ``reused``.
    """
    from prefect.runtime import flow_run, task_run

    quiet_console()  # one terminal line per shard in the process that runs it
    logger = get_run_logger()
    shard_dir = work.layout.shard_dir(shard["index"])
    marker = read_marker(shard_dir)
    run_id = str(flow_run.id) if flow_run.id else None
    ours = run_id is not None and (marker or {}).get("flow_run_id") == run_id
    if ours and check_marker(shard_dir, work.marker_expectation(shard["start"], shard["stop"])) is None:
        logger.info("%s: done marker intact, nothing to do", shard_dir.name)
        return {**marker, "reused": True}
    env = get_env(work.env_key, _worker_builder(work))
    _same_folder(work, env)
    result = process_shard(
        work.runner_cls,
        Shard(**shard),
        env,
        work.layout,
        on_error=work.on_error,
        idx_key=work.idx_key,
        # the flow and task run it finished, for the record a server outage hid (execution/catch_up.py)
        marker={
            "fingerprint": work.fingerprint,
            "identity": work.identity,
            "flow_run_id": run_id,
            "task_run_id": str(task_run.id) if task_run.id else None,
            "task_key": run_shard.task_key,
        },
        flow_run_id=run_id,
        allow_overwrite_lock=work.allow_overwrite_lock,
        log=logger.warning,
        prefetch=getattr(work, "prefetch", 0),
    )
    logger.info(
        "%s: %d items [%d, %d) in %.2f s",
        shard_dir.name,
        result["items"],
        shard["start"],
        shard["stop"],
        result["seconds"],
    )
    if result["failed"]:
        logger.warning(
            "%s: %d item(s) failed and were skipped (on_error: skip); see %s/failures.jsonl",
            shard_dir.name,
            result["failed"],
            shard_dir,
        )
    return {**result, "reused": False}
