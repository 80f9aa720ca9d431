"""Flow ``run-runner``: any ESPnet3 runner over an index list, as ESPnet3's ``runner(indices)`` does it,
with its shard tasks on the ``DaskTaskRunner`` built from the ``parallel`` block.

plan (done on the driver by :func:`espnet3_prefect.pipeline.runner_job.prepare_job`) -> manifest -> which shards
are done -> build env per worker -> run shard (task ``run-shard-<Runner>-N``, marks itself done) ->
merge (task ``merge-<Runner>``, the runner's own ``merge``) -> report. When every shard is already
done and verified, no cluster starts: the flow only merges, as upstream skips Dask with no pending
shard. Called by :func:`espnet3_prefect.run` and by ``runner(indices)`` after ``set_parallel``; the
flow run is named after the runner class.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, get_run_logger

from espnet3_prefect.execution.cluster import cancel_jobs_hook, open_task_runner
from espnet3_prefect.flows.dispatch import FORKSERVER_PRELOAD, WORKER_PRELOAD, forget_env, run_shards, take_run_lock
from espnet3_prefect.pipeline.plan import write_manifest
from espnet3_prefect.pipeline.report import format_summary, summary_rows
from espnet3_prefect.pipeline.resume import remove_stale, shards_to_redo
from espnet3_prefect.tasks.runner_steps import build_runner_env, merge_runner
from espnet3_prefect.execution.run_states import fails_with_its_message

from espnet3_prefect.flows.infer import check_writable

KIND = "run-runner"


@flow(name=KIND, log_prints=True, on_cancellation=[cancel_jobs_hook], on_crashed=[cancel_jobs_hook])
@fails_with_its_message
def run_runner(job: Any) -> Any:
    """Run a prepared :class:`espnet3_prefect.pipeline.runner_job.RunnerJob`; return what the runner's ``merge`` returns.

    Not a deployment entry point (its parameter is a live runner): call
    ``espnet3_prefect.run(runner, indices, parallel=...)`` or ``runner(indices)``.
    """
    logger = get_run_logger()
    started = time.perf_counter()
    stage, shards, spec = job.stage, job.shards, job.spec
    layout = stage.layout
    what = f"{job.name} over {layout.root}"
    check_writable(layout.root, stage.min_free_mb, key=f"{job.name}.output_dir")
    lock = take_run_lock(layout.root, logger)
    try:
        removed = remove_stale(layout, len(shards))
        if removed:
            logger.info("removed shard folders beyond the plan: %s", ", ".join(removed[:10]))
        write_manifest(layout.manifest, str(job.runner.output_dir), layout.shard_subdir, shards)
        redo = shards_to_redo(stage, shards, logger.info)
        outcome: dict[str, Any] = {"run": 0, "cached": len(shards), "failed": 0, "jobs": set(), "timing": None}
        workers = 0
        if any(redo.values()):
            logger.info("%s: %d items in %d shards; parallel: env=%s n_workers=%d", job.name, job.n_items,
                        len(shards), spec.env, spec.n_workers)
            with open_task_runner(spec, log_root=layout.inference_dir, logger=logger,
                              worker_preload=WORKER_PRELOAD,
                              forkserver_preload=FORKSERVER_PRELOAD) as runner:
                built = runner.submit(build_runner_env, {"work": stage.work, "builder": job.builder()}).result()
                workers = built["workers"]
                outcome = run_shards(runner, stage, shards, redo, what=what, kind=KIND)
                forget_env(runner, stage.work.env_key)
        else:
            logger.info("%s: all %d shards done and verified: nothing to run, no cluster started", job.name,
                        len(shards))
        result = merge_runner(stage, shards, job.n_items, what=what)
    finally:
        lock.release()
    summary = {"test_set": job.name, "shards": len(shards), "items": job.n_items, "shards_run": outcome["run"],
               "shards_cached": outcome["cached"], "failed": outcome["failed"], "jobs": sorted(outcome["jobs"]),
               "seconds": time.perf_counter() - started, "outputs": {}, "workers": workers,
               "timing": outcome["timing"]}
    _publish(summary)
    logger.info("summary: %s", format_summary([summary]))
    return result


def _publish(summary: dict) -> None:
    from prefect.artifacts import create_table_artifact

    create_table_artifact(table=summary_rows([summary]), key="run-runner-summary",
                          description=f"{KIND} {summary['test_set']}: shards run / cached, items, seconds, items/s")
