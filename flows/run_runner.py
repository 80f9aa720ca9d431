"""Flow ``run-runner``: any ESPnet3 runner over an index list, as ESPnet3's ``runner(indices)`` does it,
with its shard tasks on the ``DaskTaskRunner`` built from the ``parallel`` block.

plan (done on the driver by :func:`espnet3_prefect.pipeline.runner_job.prepare_job`) -> the pipeline
driver (:func:`espnet3_prefect.pipeline.driver.drive_stage`): manifest -> which shards are done ->
build env per worker -> run shard (task ``run-shard-<Runner>-N``, marks itself done) -> merge (task
``merge-<Runner>``, the runner's own ``merge``) -> report. When every shard is already done and
verified, no cluster starts: the flow only merges, as upstream skips Dask with no pending shard.
Called by :func:`espnet3_prefect.run` and by ``runner(indices)`` after ``set_parallel``; the flow run
is named after the runner class.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger

from espnet3_prefect.execution.cluster import cancel_jobs_hook, open_task_runner
from espnet3_prefect.execution.run_states import fails_with_its_message
from espnet3_prefect.execution.rundir import check_writable
from espnet3_prefect.flows.dispatch import DaskExecutor
from espnet3_prefect.flows.workers import FORKSERVER_PRELOAD, TASK_PRELOAD, stage_modules
from espnet3_prefect.pipeline.driver import drive_stage
from espnet3_prefect.pipeline.duration import caveat
from espnet3_prefect.pipeline.report import format_summary, quiet_console, summary_rows
from espnet3_prefect.pipeline.run_lock import release_run_lock, take_run_lock

KIND = "run-runner"


@flow(name=KIND, log_prints=True, on_cancellation=[cancel_jobs_hook], on_crashed=[cancel_jobs_hook])
@fails_with_its_message
def run_runner(job: Any) -> Any:
    """Run a prepared :class:`espnet3_prefect.pipeline.runner_job.RunnerJob`; return what the runner's
    ``merge`` returns.

    Not a deployment entry point (its parameter is a live runner): call
    ``espnet3_prefect.run(runner, indices, parallel=...)`` or ``runner(indices)``.
    """
    quiet_console()
    logger = get_run_logger()
    stage, spec = job.stage, job.spec
    layout = stage.layout
    check_writable(layout.root, stage.min_free_mb, key=f"{job.name}.output_dir")

    def open_runner():
        return open_task_runner(
            spec,
            log_root=layout.inference_dir,
            logger=logger,
            worker_preload=TASK_PRELOAD,
            forkserver_preload=FORKSERVER_PRELOAD,
            stage_modules=stage_modules([stage]),
        )

    def before_start():
        logger.info(
            "%s: %d items in %d shards; parallel: env=%s n_workers=%d",
            job.name,
            job.n_items,
            len(job.shards),
            spec.env,
            spec.n_workers,
        )

    if stage.work.max_duration is not None:
        logger.warning(caveat(stage.work.max_duration, whole_test_set=False))
    from espnet3_prefect.execution.api_reach import set_api_outage_s

    set_api_outage_s(spec.api_outage_s)  # how long this stage waits for a server that is not its own
    lock = take_run_lock(layout.root, logger)
    try:
        with DaskExecutor(
            open_runner,
            logger,
            infer=False,
            what=f"{job.name} over {layout.root}",
            before_start=before_start,
            make_builder=job.builder,
            no_worker_timeout_s=spec.no_worker_timeout_s,
        ) as executor:
            summary, result = drive_stage(stage, executor, shards=job.shards)
    finally:
        release_run_lock(lock, layout.root)
    _publish(summary.to_dict())
    logger.info("summary: %s", format_summary([summary.to_dict()]))
    return result


def _publish(summary: dict) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(
        table=summary_rows([summary]),
        key="run-runner-summary",
        description=f"{KIND} {summary['test_set']}: shards run / cached, items, seconds, items/s",
    )
