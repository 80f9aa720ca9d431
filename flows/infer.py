"""Flow ``infer``: config -> complete? -> build env per worker -> plan shards -> which shards run -> run
shard -> mark done -> merge -> report (docs/datapath.md).

Tasks run on a prefect-dask ``DaskTaskRunner`` built from the config's ``parallel`` block, so one
flow serves every backend; the block is read at run time, which lets deployments pass configs.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from espnet3_prefect._internal.util import put_on_pythonpath
from espnet3_prefect.config.load import load_config_input
from espnet3_prefect.execution.cluster import cancel_jobs_hook, open_task_runner
from espnet3_prefect.execution.run_states import fails_with_its_message
from espnet3_prefect.execution.rundir import check_writable, enter_workdir, preload_on_main_thread
from espnet3_prefect.flows.dispatch import DaskExecutor
from espnet3_prefect.flows.workers import INFER_FORKSERVER_PRELOAD, TASK_PRELOAD, stage_modules
from espnet3_prefect.pipeline.dataprep import ensure_prepared
from espnet3_prefect.pipeline.driver import drive_stage
from espnet3_prefect.pipeline.duration import caveat
from espnet3_prefect.pipeline.report import CONSOLE_OFF, format_summary, publish_summary, quiet_console
from espnet3_prefect.pipeline.resume import already_complete
from espnet3_prefect.pipeline.run_lock import release_run_lock, take_run_lock
from espnet3_prefect.pipeline.run_plan import RunPlan, plan_run


@flow(name="infer", log_prints=True, on_cancellation=[cancel_jobs_hook], on_crashed=[cancel_jobs_hook])
@fails_with_its_message
def infer(
    config: list[str] | str | dict, overrides: list[str] | None = None, workdir: str | None = None, plan: Any = None
) -> list[dict]:
    """Run the ESPnet3 infer stage for every test set of ``config``: config files merged left to
    right (or one already-loaded config as a dict), then ``overrides``.

    ``workdir``: run from that folder (relative paths, recipe modules), as deployments do for
    ``espnet3-prefect infer --detach``. ``plan``: the
    :class:`~espnet3_prefect.pipeline.run_plan.RunPlan` a front door in this process built from this
    ``config`` (recorded as ``"<RunPlan>"``); without it (a deployment's run) the flow builds its own.

    Example (embedded default: a local Prefect server and a local Dask cluster)::

        espnet3-prefect infer --config recipes/dtmf/conf/inference.yaml parallel.n_workers=2
    """
    quiet_console()
    if __name__ != "espnet3_prefect.flows.infer":  # a deployment loaded this file as a script module
        # what is pickled from it refers to that module: batch jobs (they get the exported PYTHONPATH)
        # must import it too; appended, so nothing on the path is shadowed
        put_on_pythonpath(Path(__file__).parent, first=False, here_too=False)
    enter_workdir(workdir)
    preload_on_main_thread()  # espnet3's classes import dask_jobqueue, which must happen on the main thread
    if not isinstance(plan, RunPlan):
        get_run_logger().info("infer: planning the run here (no plan was handed over, as for a deployment's run)")
        plan = plan_run(load_config_input(config, overrides))
    spec, stages = plan.spec, plan.stages
    plan.preflight()  # local_gpu without GPUs fails here, also when every shard is cached
    for stage in stages:
        check_writable(stage.out_dir, stage.min_free_mb)
    logger = get_run_logger()
    if not plan.inputs_checked:  # a front door checked them (and made the data) before the server started
        for made in ensure_prepared(plan.config):  # e.g. the DTMF demo's audio on a fresh clone
            logger.info("prepared data: %s", made)
    lock = take_run_lock(stages[0].layout.run_lock_dir, logger)
    try:
        logger.info(
            "parallel: env=%s n_workers=%d; test sets: %s",
            spec.env,
            spec.n_workers,
            ", ".join(s.test_set for s in stages),
        )
        keyed = next((s.work for s in stages if s.work.max_duration is not None), None)
        if keyed is not None:  # once per run: every test set shares the runner block
            logger.warning(caveat(keyed.max_duration, whole_test_set=keyed.length_order))
        summaries, recorded = _run_stages(plan, logger)
    finally:
        release_run_lock(lock, stages[0].layout.run_lock_dir)
    _publish(summaries, recorded)
    logger.info("summary:\n%s", format_summary(summaries), extra=CONSOLE_OFF)  # the CLI prints it on stdout
    return summaries


def _publish(summaries: list[dict], recorded: Callable[[], Any] | None) -> None:
    """Publish the summary while the server records the run's last task runs (``recorded``: its
    recorder writes once a second); both are done when this returns. Not beside a warm-up still
    drawing (matplotlib's caches). A function of its own: the flow function, pickled by value with
    its tasks, must not reach the lock."""
    with _meanwhile(recorded), _CHARTS:
        publish_summary(summaries)


@contextlib.contextmanager
def _meanwhile(work: Callable[[], Any] | None) -> Iterator[None]:
    """``work()`` in a thread (in this thread's context: the flow run's API and logger) while the block
    runs; the block's end waits for it (it is bounded: ``DaskExecutor.wait_recorded``, about 80 s at most)."""
    if work is None:
        yield
        return
    thread = threading.Thread(target=contextvars.copy_context().run, args=(work,), name="e3p-recorded", daemon=True)
    thread.start()
    try:
        yield
    finally:
        thread.join(120)  # the record wait: up to 60 s while it grows, then what the markers send (dispatch.py)


def _warm_summary() -> None:
    """Draw one throwaway chart while the shards run: the summary's first chart in a process otherwise
    pays matplotlib's import and first text layout (~0.5-1.5 s measured on 2 cores) after the last
    shard, when nothing else is left to do. A process that has drawn one already skips it."""
    import sys

    with _CHARTS:
        if "matplotlib.backends.backend_agg" in sys.modules:
            return
        from espnet3_prefect.pipeline.throughput import figure_png, workers_figure

        figure_png(workers_figure("warm-up", [{"worker": "w", "items_per_worker_s": 1.0}]))


#: held while a chart is drawn: the warm-up and the summary's charts one at a time
_CHARTS = threading.Lock()


def _run_stages(plan: RunPlan, logger) -> tuple[list[dict], Callable[[], Any] | None]:
    """Drive the test sets that need work (one cluster for all of them, started only when one does).
    Returns the summaries and, when task runs were started, the wait until the server holds them all
    (:meth:`~espnet3_prefect.flows.dispatch.DaskExecutor.wait_recorded`), for the flow to call."""
    spec, stages = plan.spec, plan.stages
    finished, sizing = {}, {}
    for stage in stages:
        sizing[stage.test_set] = plan.sizing(stage)
        summary, why = already_complete(stage, sizing[stage.test_set])
        finished[stage.test_set] = summary
        if summary:
            logger.info(
                "%s: all %d shards done and verified, merged outputs intact: nothing to run",
                stage.test_set,
                summary.shards,
            )
        else:
            logger.info("%s: to run (%s)", stage.test_set, why)
    todo = [s for s in stages if finished[s.test_set] is None]
    recorded = None
    if todo:

        def open_runner():
            return open_task_runner(
                spec,
                log_root=stages[0].layout.inference_dir,
                logger=logger,
                worker_preload=TASK_PRELOAD,
                forkserver_preload=INFER_FORKSERVER_PRELOAD,
                stage_modules=stage_modules(todo),
            )

        from espnet3_prefect.execution.api_reach import set_api_outage_s

        set_api_outage_s(spec.api_outage_s)  # how long this stage waits for a server that is not its own
        with DaskExecutor(
            open_runner,
            logger,
            infer=True,
            no_worker_timeout_s=spec.no_worker_timeout_s,
            record_later=True,
            beside_shards=_warm_summary,
        ) as executor:
            for stage in todo:
                finished[stage.test_set], _ = drive_stage(stage, executor, sizing=sizing[stage.test_set])
        recorded = executor.wait_recorded
    return [finished[s.test_set].to_dict() for s in stages], recorded
