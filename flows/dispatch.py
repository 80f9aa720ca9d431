"""The flows' executor of the pipeline driver: the steps of a stage as Prefect tasks on the flow's
``DaskTaskRunner`` (:class:`DaskExecutor`), shared by ``infer`` and ``run-runner``.

What the workers import before their first task is :mod:`espnet3_prefect.flows.workers`'s;
:func:`run_shards` submits one ``run-shard`` task per shard the done markers say must run (the driver
counts the finished ones without a task) and books them as they finish (progress bar + artifact,
counts, one line per failed shard: :func:`shard_failure`). The cluster's watches are
:mod:`espnet3_prefect.execution.worker_watch`'s: ``NoWorkers`` stops a run whose workers are all gone
and stay gone; ``LostWorkers`` marks the task runs of shards whose workers died Crashed, beside the
booking. The flows' run lock is :func:`espnet3_prefect.pipeline.run_lock.take_run_lock`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from espnet3_prefect.errors import DiskFullError, Espnet3PrefectError, describe, disk_full, is_retryable, no_space
from espnet3_prefect.execution.api_reach import outages_begun, wait_until_up
from espnet3_prefect.execution.catch_up import record_from_markers
from espnet3_prefect.execution.run_states import wait_until_recorded
from espnet3_prefect.execution.task_runner import heartbeats_unjoined
from espnet3_prefect.execution.worker_watch import LostWorkers, NoWorkers, get_logger
from espnet3_prefect.pipeline.plan import Shard, longest_first
from espnet3_prefect.pipeline.report import Progress, add_timing, empty_timing
from espnet3_prefect.pipeline.resume import redo_reason
from espnet3_prefect.pipeline.stage import Stage, StageWork
from espnet3_prefect.pipeline.summary import ShardOutcome
from espnet3_prefect.tasks.build_env import build_env
from espnet3_prefect.tasks.merge_shards import merge_shards

# before any flow of ours runs: a flow run ends when its function returns, not up to a second later
heartbeats_unjoined()

#: after an outage, how long the cluster stays up for its workers to send what the server missed (their
#: Prefect clients send again every 30 s once it answers); what is still missing then comes from the markers
RESEND_S = 40.0
#: at a stage's end, how long the record may take to be whole while the server's recorder still catches
#: up, and how long it may stand still before the rest is taken as lost (and sent from the done markers)
RECORD_MAX_S, STALL_S = 60.0, 15.0


class DaskExecutor:
    """The driver's steps on a ``DaskTaskRunner``: ``build-env`` and ``run-shard`` tasks submitted to it,
    ``merge`` as a task on the driver. ``open_runner`` opens the task runner (a context manager); it is
    called the first time a step needs it, so a stage with nothing to run starts no cluster, and the
    cluster stays up, for the next stage too, until the ``with`` block ends. ``infer``: the infer stage
    (its env sized from the dataset, its merge recorded); else a runner job named ``what``.
    ``no_worker_timeout_s`` (``parallel.no_worker_timeout_s``): see :class:`NoWorkers`.

    When the block ends without an error, the server must hold every task run the executor started
    before the flow run may end (:func:`~espnet3_prefect.execution.run_states.wait_until_recorded`):
    the exit waits for it, or with ``record_later`` leaves that wait to :meth:`wait_recorded`, which
    the flow calls before it returns (the infer flow publishes its summary meanwhile).
    ``beside_shards``: called once, in a daemon thread, when the first shards are submitted (work
    the driver can do while the workers run, e.g. imports its summary needs).
    """

    def __init__(
        self,
        open_runner: Callable[[], Any],
        log,
        *,
        infer: bool,
        what: str | None = None,
        before_start: Callable[[], None] | None = None,
        make_builder: Callable[[], Any] | None = None,
        no_worker_timeout_s: float | None = None,
        record_later: bool = False,
        beside_shards: Callable[[], None] | None = None,
    ):
        self._open_runner, self._before_start, self._make_builder = open_runner, before_start, make_builder
        self.record_later, self._beside_shards = record_later, beside_shards
        self._to_record: tuple[Any, int] | None = None
        self.no_worker_timeout_s = no_worker_timeout_s
        self.no_workers: NoWorkers | None = None
        self._stack = contextlib.ExitStack()
        self.runner = None
        self.log, self.what = log, what
        self.sized = self.records_merge = infer
        self.kind = "infer" if infer else "run-runner"
        #: task runs this flow run started (build-env, run-shard, merge): what the server must hold when it ends
        self.task_runs = 0
        self._shard_dirs: list = []  # of the shards it ran: their markers make the record whole after an outage
        self._outages_at_start = outages_begun()

    def _task_runner(self):
        if self.runner is None:
            if self._before_start is not None:
                self._before_start()
            self.runner = self._stack.enter_context(self._open_runner())
            from espnet3_prefect.execution.task_runner import never_holds_futures  # loaded with the runner

            # frozen, plain values: Prefect need not walk a stage's work object for futures on each submit
            never_holds_futures(StageWork)
            self.no_workers = self._stack.enter_context(NoWorkers(self.runner.client, self.no_worker_timeout_s))
        return self.runner

    def __enter__(self) -> DaskExecutor:
        return self

    def __exit__(self, *exc) -> bool:
        try:
            if exc[0] is None and self.task_runs:
                from prefect.runtime import flow_run

                # The workers keep in memory what an unreachable server could not take, and send it once
                # it answers: the cluster closes only then, and after an outage once the server holds the
                # record or RESEND_S have passed (their clients send again every 30 s)
                wait_until_up()
                if outages_begun() > self._outages_at_start:
                    wait_until_recorded(flow_run.get_id(), self.task_runs, timeout_s=RESEND_S, quiet=True)
        finally:  # also when the server watch ends the run meanwhile: the cluster closes all the same
            suppressed = self._stack.__exit__(*exc)
        if exc[0] is None and self.task_runs:
            # the flow run ends Completed only once the server shows every task run it started
            self._to_record = (flow_run.get_id(), self.task_runs)
            if not self.record_later:
                self.wait_recorded()
        return suppressed

    def wait_recorded(self) -> bool:
        """Wait until the server holds every task run this executor started (once; see the class).
        After an outage, the shards it still lacks are sent from their done markers first
        (:mod:`espnet3_prefect.execution.catch_up`)."""
        pending, self._to_record = self._to_record, None
        if pending is None:
            return True
        flow_run_id, expected = pending
        # while the recorder catches up (a busy server), up to RECORD_MAX_S; once nothing more arrives for
        # STALL_S, what is missing was lost on the way (workers cut off from the API, their clients'
        # buffers gone with the cluster, or an outage): it is sent from the shards' done markers
        if wait_until_recorded(flow_run_id, expected, timeout_s=RECORD_MAX_S, stall_s=STALL_S, quiet=True):
            return True
        sent = record_from_markers(self._shard_dirs, flow_run_id)
        if sent:
            self.log.warning("recorded %d shard(s) from their done markers: their own reports were lost", sent)
        return wait_until_recorded(flow_run_id, expected)

    def build_env(self, stage: Stage) -> dict:
        builder = stage.builder if stage.builder is not None else self._make_builder()
        self.task_runs += 1
        future = self._task_runner().submit(build_env, {"work": stage.work, "builder": builder, "sized": self.sized})
        return self.no_workers.result(future)

    def run_shards(self, stage: Stage, shards: list[Shard]) -> ShardOutcome:
        self.task_runs += len(shards)
        self._shard_dirs += [stage.layout.shard_dir(shard.index) for shard in shards]
        runner = self._task_runner()
        if self._beside_shards is not None:
            _in_background(self._beside_shards, "e3p-beside-shards")
            self._beside_shards = None
        return run_shards(runner, stage, shards, what=self.what, kind=self.kind, no_workers=self.no_workers)

    def merge(self, stage: Stage, shards: list[Shard], n_items: int) -> tuple[Any, dict[str, str]]:
        self.task_runs += 1
        return merge_shards(stage, shards, n_items, record=self.records_merge, what=self.what)

    def forget_env(self, stage: Stage) -> None:
        """Drop the stage's env on every worker (frees the model before the next stage)."""
        if self.runner is None:
            return
        try:
            self.runner.client.unregister_worker_plugin(f"espnet3-env-{stage.work.env_key}")
        except Exception:  # noqa: BLE001 - best effort: a worker that left has nothing to free
            pass


def _in_background(work: Callable[[], None], name: str) -> None:
    """``work()`` in a daemon thread, in this thread's context (the flow run's logger); what it raises
    is logged at debug level: it only saves time."""
    import contextvars
    import logging
    import threading

    def run() -> None:
        try:
            work()
        except Exception as exc:  # noqa: BLE001
            logging.getLogger("espnet3_prefect").debug("%s: %s", name, exc)

    threading.Thread(target=contextvars.copy_context().run, args=(run,), name=name, daemon=True).start()


def run_shards(
    runner, stage, shards: list[Shard], *, what: str | None = None, kind: str = "infer", no_workers: NoWorkers
) -> ShardOutcome:
    """Submit ``shards`` (each one runs: the driver left out those already done) and book them as they
    finish. The first failure that a retry cannot fix
    (bad input, bad config) stops the stage at once; other failures (a worker that keeps dying,
    retries exhausted) let the remaining shards finish, so their work is kept, then fail it.

    ``what`` names the stage in errors (default ``test set '<name>'``); ``kind`` heads the progress
    artifact's description. The outcome's ``timing`` sums the shards run
    (:func:`espnet3_prefect.pipeline.report.add_timing`) and adds ``busy_s`` (their seconds) and
    ``wall_s`` (first submission to last result). ``no_workers`` stops the stage when every worker
    is gone for good (its one-line error; the shards done so far stay done).
    """
    import time

    from distributed import as_completed

    from espnet3_prefect.tasks.run_shard import run_shard

    what = what or f"test set {stage.test_set!r}"
    # Drawn before the first submission: a shard can finish while later ones are still being submitted.
    progress = Progress(stage.test_set, len(shards), sum(s.n_items for s in shards), kind=kind)
    pending: dict = {}
    submitted = time.perf_counter()
    # With parallel.shard_duration: longest first, each to the next worker that frees up (Dask queues
    # the tasks on the scheduler and hands out the highest priority first); else in plan order.
    order = longest_first(shards) if getattr(stage, "shard_duration", None) is not None else shards
    for rank, shard in enumerate(order):
        task = run_shard.with_options(retries=stage.retries, retry_delay_seconds=list(stage.retry_delay_s))
        parameters = {"work": stage.work, "shard": shard.to_dict()}
        future = runner.submit(task, parameters, priority=len(order) - rank)
        pending[future.wrapped_future.key] = (future, shard)
    outcome = ShardOutcome(timing=empty_timing())
    failures = []
    futures = [f.wrapped_future for f, _ in pending.values()]
    no_workers.cancels(futures)
    with LostWorkers(runner.client, pending, log=get_logger(), where=shard_where) as lost:
        for done in as_completed(futures, loop=runner.client.loop):
            if no_workers.gone:
                # done by their markers, not by the results gathered (a dead worker can take a
                # finished shard's result with it)
                done = sum(redo_reason(stage, s) is None for s in shards)
                raise Espnet3PrefectError(
                    f"{what}: {no_workers.gone}; {done} of the {len(shards)} shards it ran are done"
                )
            failures += _book(runner, done, pending, outcome, progress, what, lost)
    outcome.timing["wall_s"] = round(time.perf_counter() - submitted, 4)
    if failures:
        raise Espnet3PrefectError(f"{what}: {len(failures)} shard(s) failed: " + "; ".join(failures[:5]))
    return outcome


def _book(
    runner, done, pending: dict, outcome: ShardOutcome, progress: Progress, what: str, lost: LostWorkers
) -> list[str]:
    """Book one finished shard; returns its failure line (empty when it succeeded). A shard whose worker
    died is marked Crashed in the API by ``lost``'s thread: the booking does not wait for it."""
    future, shard = pending.pop(done.key)
    try:
        result = future.result()
    except Exception as exc:  # failed after retries, or the worker died (KilledWorker)
        line = shard_failure(shard, exc)
        if _killed(exc):  # Dask lost it: Prefect never saw the end of the task run
            from prefect.runtime import flow_run

            from espnet3_prefect.tasks.run_shard import run_shard

            name = f"run-shard-{shard.test_set}-{shard.index}"
            lost.crashed(future.task_run_id, line, task=run_shard, name=name, flow_run_id=flow_run.id)
        if not is_retryable(exc):
            # A full disk or a lock too: the shards still queued would meet the same, so none is started.
            runner.client.cancel([f.wrapped_future for f, _ in pending.values()])
            why = "" if no_space(exc) or isinstance(exc, DiskFullError) else "the same input fails the same way; "
            raise Espnet3PrefectError(f"{what}: {line} (not retried: {why}the other shards were stopped)") from None
        return [line]
    if result.get("reused"):  # Dask ran a task again whose result died with its worker: done by this run
        outcome.cached += 1
    else:
        outcome.run += 1
        add_timing(outcome.timing, result)
        if result.get("job_id"):
            outcome.jobs.add(result["job_id"])
    outcome.failed += result.get("failed", 0)
    progress.advance(shard.n_items)
    return []


def shard_where(shard: Shard) -> str:
    """``split.3 items [8, 12)``; over an explicit index list, the dataset indices it covers.

    >>> shard_where(Shard("t", 3, 8, 12)), shard_where(Shard("t", 1, 2, 4, indices=(40, 7)))
    ('split.3 items [8, 12)', 'split.1 indices 40..7 (positions [2, 4) of the index list)')
    """
    if shard.indices is None:
        return f"split.{shard.index} items [{shard.start}, {shard.stop})"
    first, last = shard.indices[0], shard.indices[-1]
    return f"split.{shard.index} indices {first}..{last} (positions [{shard.start}, {shard.stop}) of the index list)"


def shard_failure(shard: Shard, exc: Exception) -> str:
    """One line naming the shard and why it failed.

    >>> from distributed.scheduler import KilledWorker
    >>> shard_failure(Shard("t", 3, 8, 12), KilledWorker("run-shard-3", "tcp://w", 3))
    'split.3 items [8, 12): its worker died while running it (KilledWorker); not retried further'
    """
    where = shard_where(shard)
    if _killed(exc):
        return f"{where}: its worker died while running it ({type(exc).__name__}); not retried further"
    full = None if isinstance(exc, DiskFullError) else no_space(exc)
    return f"{where}: {describe(disk_full(full) if full is not None else exc)}"


def _killed(exc: Exception) -> bool:
    """Whether Dask gave up on the task because the workers running it died."""
    from distributed.scheduler import KilledWorker

    return isinstance(exc, KilledWorker)
