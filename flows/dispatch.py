"""The flows' executor of the pipeline driver: the steps of a stage as Prefect tasks on the flow's
``DaskTaskRunner`` (:class:`DaskExecutor`), shared by ``infer`` and ``run-runner``.

What the workers import before their first task is :mod:`espnet3_prefect.flows.workers`'s;
:func:`run_shards` submits one ``run-shard`` task per shard the done markers say must run (the driver
counts the finished ones without a task) and books them as they finish (progress bar + artifact,
counts, one line per failed shard); :class:`NoWorkers` stops a run whose workers are all gone and
stay gone; :func:`take_run_lock` takes a folder's run lock and marks the flow run of a killed earlier
holder Crashed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from espnet3_prefect.errors import DiskFullError, Espnet3PrefectError, describe, disk_full, is_retryable, no_space
from espnet3_prefect.execution.run_states import (
    mark_flow_run_crashed,
    mark_running_task_run_crashed,
    mark_task_run_crashed,
    wait_until_recorded,
)
from espnet3_prefect.execution.task_runner import heartbeats_unjoined
from espnet3_prefect.pipeline.lock import RunLock, acquire
from espnet3_prefect.pipeline.plan import Shard, longest_first
from espnet3_prefect.pipeline.report import Progress, add_timing, empty_timing
from espnet3_prefect.pipeline.resume import redo_reason
from espnet3_prefect.pipeline.stage import Stage, StageWork
from espnet3_prefect.pipeline.summary import ShardOutcome
from espnet3_prefect.tasks.build_env import build_env
from espnet3_prefect.tasks.merge_shards import merge_shards

# before any flow of ours runs: a flow run ends when its function returns, not up to a second later
heartbeats_unjoined()


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
        suppressed = self._stack.__exit__(*exc)
        if exc[0] is None and self.task_runs:
            from prefect.runtime import flow_run

            # the flow run ends Completed only once the server shows every task run it started
            self._to_record = (flow_run.get_id(), self.task_runs)
            if not self.record_later:
                self.wait_recorded()
        return suppressed

    def wait_recorded(self) -> bool:
        """Wait until the server holds every task run this executor started (once; see the class)."""
        pending, self._to_record = self._to_record, None
        return True if pending is None else wait_until_recorded(*pending)

    def build_env(self, stage: Stage) -> dict:
        builder = stage.builder if stage.builder is not None else self._make_builder()
        self.task_runs += 1
        future = self._task_runner().submit(build_env, {"work": stage.work, "builder": builder, "sized": self.sized})
        return self.no_workers.result(future)

    def run_shards(self, stage: Stage, shards: list[Shard]) -> ShardOutcome:
        self.task_runs += len(shards)
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
    with LostWorkers(runner.client, pending, log=get_logger()):
        for done in as_completed(futures, loop=runner.client.loop):
            if no_workers.gone:
                # done by their markers, not by the results gathered (a dead worker can take a
                # finished shard's result with it)
                done = sum(redo_reason(stage, s) is None for s in shards)
                raise Espnet3PrefectError(
                    f"{what}: {no_workers.gone}; {done} of the {len(shards)} shards it ran are done"
                )
            failures += _book(runner, done, pending, outcome, progress, what)
    outcome.timing["wall_s"] = round(time.perf_counter() - submitted, 4)
    if failures:
        raise Espnet3PrefectError(f"{what}: {len(failures)} shard(s) failed: " + "; ".join(failures[:5]))
    return outcome


def _book(runner, done, pending: dict, outcome: ShardOutcome, progress: Progress, what: str) -> list[str]:
    """Book one finished shard; returns its failure line (empty when it succeeded)."""
    future, shard = pending.pop(done.key)
    try:
        result = future.result()
    except Exception as exc:  # failed after retries, or the worker died (KilledWorker)
        line = shard_failure(future, shard, exc)
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


def get_logger():
    """The flow run's logger, or this package's outside a flow run."""
    import logging

    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - no run context
        return logging.getLogger("espnet3_prefect")


class LostWorkers:
    """While a stage's shards run: when Dask removes a worker (its batch job preempted, killed at its
    walltime, its node gone), the shard it was running is lost with it. Dask runs that shard again on
    another worker, under the same task run; this marks the task run Crashed first, so the run's record
    shows where the time went (Running, Crashed, then Running and Completed on the worker that redid
    it), and says so on one line. Shards merely queued on the lost worker are left alone: they never
    started. Dask's scheduler announces the removal on its ``all`` event topic (with the keys the
    worker was processing); the marking is done by one thread of ours, joined (bounded) on exit."""

    JOIN_S = 30.0

    def __init__(self, client, pending: dict, log):
        import queue

        self.client, self.pending, self.log = client, pending, log
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread = None

    def __enter__(self) -> LostWorkers:
        import contextvars
        import threading

        # In this thread's context: the flow run's settings (its API URL) and logger go with it.
        context = contextvars.copy_context()
        self.thread = threading.Thread(target=context.run, args=(self._mark,), name="e3p-lost-workers", daemon=True)
        self.thread.start()
        try:
            self.client.subscribe_topic("all", self._heard)
        except Exception as exc:  # noqa: BLE001 - a scheduler without events: shards still rerun
            self.log.debug("not watching for lost workers: %s", exc)
        return self

    def __exit__(self, *exc) -> None:
        import contextlib

        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic("all")
        self.queue.put(None)
        self.thread.join(self.JOIN_S)

    def _heard(self, event) -> None:  # on the client's event loop: hand over, never block it
        _when, message = event
        if isinstance(message, dict) and message.get("action") == "remove-worker":
            for key in message.get("processing-tasks") or ():
                found = self.pending.get(key)
                if found is not None:
                    self.queue.put((found, message.get("worker")))

    def _mark(self) -> None:
        while (item := self.queue.get()) is not None:
            (future, shard), worker = item
            if future.wrapped_future.done():
                continue
            where = shard_where(shard)
            message = f"{where}: its worker {worker} was lost while running it; the shard runs again elsewhere"
            if mark_running_task_run_crashed(future.task_run_id, message):
                self.log.warning("%s", message)


class NoWorkers:
    """Stops a run whose workers are all gone and stay gone. Dask keeps a task whose workers left
    waiting for another, forever: a batch job that never comes back, a nanny that could not restart
    its worker (it failed to start again), a running scheduler's workers stopped by their owner. Once
    the cluster has had a worker, a thread asks the scheduler every ``POLL_S`` how many it has; after
    ``timeout_s`` with none (``parallel.no_worker_timeout_s``: 300 s by default, 3600 s for batch
    schedulers, whose replacement jobs may queue; None waits forever) it cancels the futures it was
    given, so the flow's wait ends, and :attr:`gone` says why on one line. The shards that finished
    keep their done markers, so a new run resumes. A cluster still waiting for its first worker (a
    batch queue) is left alone."""

    POLL_S = 1.0

    def __init__(self, client, timeout_s: float | None):
        import threading

        self.client, self.timeout_s = client, timeout_s
        #: why the run stops (one line), once every worker has been gone for ``timeout_s``
        self.gone: str | None = None
        self._futures: list = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self) -> NoWorkers:
        import threading

        if self.timeout_s is not None:
            import contextvars

            # in this thread's context: the flow run's logger goes with it
            context = contextvars.copy_context()
            self._thread = threading.Thread(target=context.run, args=(self._watch,), name="e3p-no-workers", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10 * self.POLL_S)

    def cancels(self, futures: list) -> None:
        """Dask futures to cancel when the workers are gone for good (at once if they already are)."""
        with self._lock:
            self._futures = list(futures)
            gone = self.gone
        if gone:
            self.client.cancel(futures)

    def result(self, future):
        """``future.result()`` (a Prefect future), or the one-line error once the workers are gone."""
        self.cancels([future.wrapped_future])
        try:
            return future.result()
        except BaseException:
            if self.gone:
                raise Espnet3PrefectError(self.gone) from None
            raise

    def _watch(self) -> None:
        import time

        last: list[str] = []
        empty_since = None
        while not self._stop.wait(self.POLL_S):
            try:
                workers = sorted(self.client.nthreads())
            except Exception:  # noqa: BLE001 - the scheduler itself gone: the client's own errors say so
                continue
            if workers:
                last, empty_since = workers, None
                continue
            if not last:  # no worker yet (a batch queue): not this watch's to judge
                continue
            if empty_since is None:
                empty_since = time.monotonic()
                left_at = time.strftime("%H:%M:%S")
            if time.monotonic() - empty_since < self.timeout_s:
                continue
            names = ", ".join(last[:3]) + (f" and {len(last) - 3} more" if len(last) > 3 else "")
            with self._lock:
                self.gone = (
                    f"no Dask worker for {self.timeout_s:g} s (the last, {names}, left at {left_at}) and none came "
                    "back, so the run stops; the finished shards are kept, run again to resume "
                    "(parallel.no_worker_timeout_s: how long to wait; null waits forever)"
                )
                futures = self._futures
            get_logger().error("%s", self.gone)
            self.client.cancel(futures)
            return


def shard_where(shard: Shard) -> str:
    """``split.3 items [8, 12)``; over an explicit index list, the dataset indices it covers.

    >>> shard_where(Shard("t", 3, 8, 12)), shard_where(Shard("t", 1, 2, 4, indices=(40, 7)))
    ('split.3 items [8, 12)', 'split.1 indices 40..7 (positions [2, 4) of the index list)')
    """
    if shard.indices is None:
        return f"split.{shard.index} items [{shard.start}, {shard.stop})"
    first, last = shard.indices[0], shard.indices[-1]
    return f"split.{shard.index} indices {first}..{last} (positions [{shard.start}, {shard.stop}) of the index list)"


def shard_failure(future, shard: Shard, exc: Exception) -> str:
    """One line naming the shard; a shard whose worker died is marked Crashed in the API."""
    from distributed.scheduler import KilledWorker

    where = shard_where(shard)
    if isinstance(exc, KilledWorker):  # Dask lost it: Prefect never saw the end of the task run
        from prefect.runtime import flow_run

        from espnet3_prefect.tasks.run_shard import run_shard

        message = f"{where}: its worker died while running it ({type(exc).__name__}); not retried further"
        mark_task_run_crashed(
            future.task_run_id,
            message,
            task=run_shard,
            name=f"run-shard-{shard.test_set}-{shard.index}",
            flow_run_id=flow_run.id,
        )
        return message
    full = None if isinstance(exc, DiskFullError) else no_space(exc)
    return f"{where}: {describe(disk_full(full) if full is not None else exc)}"


def take_run_lock(folder: Path, logger) -> RunLock:
    """Take ``folder``'s run lock; a killed earlier run's flow run is marked Crashed."""
    from prefect.runtime import flow_run

    lock = acquire(folder, str(flow_run.id) if flow_run.id else None)
    stale = lock.stale_holder
    if stale:
        logger.warning("took over the lock of a run that is gone (pid %s on %s)", stale.get("pid"), stale.get("host"))
        if stale.get("flow_run_id") and mark_flow_run_crashed(
            stale["flow_run_id"], f"its process (pid {stale.get('pid')} on {stale.get('host')}) is gone"
        ):
            logger.warning("marked the stale flow run %s as Crashed", stale["flow_run_id"])
    return lock
