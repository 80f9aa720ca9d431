"""Watching a flow run's Dask workers while its tasks run: :class:`LostWorkers` (a worker removed while
running a shard; and the API writes about shards whose workers died, off the booking thread) and
:class:`NoWorkers` (every worker gone and none coming back). The batch jobs behind the workers are
watched by :class:`espnet3_prefect.execution.backends.watcher.JobWatcher`."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.execution.abort import Abort
from espnet3_prefect.execution.run_states import mark_running_task_run_crashed, mark_task_run_crashed


def get_logger():
    """The flow run's logger, or this package's outside a flow run."""
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - no run context
        return logging.getLogger("espnet3_prefect")


class LostWorkers:
    """While a stage's shards run, one thread of ours makes the API writes about shards whose workers
    died, so booking the results never waits on the API (a mark may retry for a minute on a busy server).

    A worker lost: when Dask removes a worker (its batch job preempted, killed at its walltime, its node
    gone), the shard it was running is lost with it. Dask runs that shard again on another worker, under
    the same task run; this marks the task run Crashed first, so the run's record shows where the time
    went (Running, Crashed, then Running and Completed on the worker that redid it), and says so on one
    line. Shards merely queued on the lost worker are left alone: they never started. Dask's scheduler
    announces the removal on its ``all`` event topic (with the keys the worker was processing).
    ``pending``: the submitted shards, Dask key -> (Prefect future, shard); ``where(shard)`` names one.

    A shard Dask gave up on (``KilledWorker``): :meth:`crashed` hands its mark to the same thread.

    The thread runs in the context of the thread that entered (the flow run's API settings and
    logger), and is joined on exit, bounded: ``JOIN_S``, or longer while a :meth:`crashed` mark is
    still within its own ``MARK_S`` budget, so in the normal case every mark is made before the flow
    run ends."""

    JOIN_S = 30.0
    MARK_S = 60.0  # one crash mark's budget (mark_task_run_crashed's retries), counted from its hand-over

    def __init__(self, client, pending: dict, log, where: Callable[[Any], str]):
        self.client, self.pending, self.log, self.where = client, pending, log, where
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.thread: threading.Thread | None = None
        self._due = 0.0  # when the last crash mark handed over runs out of budget (monotonic)

    def __enter__(self) -> LostWorkers:
        context = contextvars.copy_context()
        self.thread = threading.Thread(target=context.run, args=(self._work,), name="e3p-lost-workers", daemon=True)
        self.thread.start()
        try:
            self.client.subscribe_topic("all", self._heard)
        except Exception as exc:  # noqa: BLE001 - a scheduler without events: shards still rerun
            self.log.debug("not watching for lost workers: %s", exc)
        return self

    def __exit__(self, *exc) -> None:
        with contextlib.suppress(Exception):
            self.client.unsubscribe_topic("all")
        self.queue.put(None)
        self.thread.join(max(self.JOIN_S, self._due - time.monotonic()))

    def crashed(self, task_run_id, message: str, **run: Any) -> None:
        """Mark a task run whose worker died Crashed
        (:func:`~espnet3_prefect.execution.run_states.mark_task_run_crashed`, ``run`` its ``task``,
        ``name`` and ``flow_run_id``), in the watch's thread: returns at once."""
        due = time.monotonic() + self.MARK_S
        self._due = max(self._due, due)
        self.queue.put(functools.partial(self._crash, task_run_id, message, due, run))

    def _crash(self, task_run_id, message: str, due: float, run: dict) -> None:
        mark_task_run_crashed(task_run_id, message, timeout_s=max(0.0, due - time.monotonic()), **run)

    def _heard(self, event) -> None:  # on the client's event loop: hand over, never block it
        _when, message = event
        if isinstance(message, dict) and message.get("action") == "remove-worker":
            for key in message.get("processing-tasks") or ():
                found = self.pending.get(key)
                if found is not None:
                    self.queue.put(functools.partial(self._lost, found, message.get("worker")))

    def _lost(self, found: tuple, worker) -> None:
        future, shard = found
        if future.wrapped_future.done():
            return
        message = f"{self.where(shard)}: its worker {worker} was lost while running it; the shard runs again elsewhere"
        if mark_running_task_run_crashed(future.task_run_id, message):
            self.log.warning("%s", message)

    def _work(self) -> None:
        while (work := self.queue.get()) is not None:
            try:
                work()
            except Exception as exc:  # noqa: BLE001 - reporting: the next mark still gets made
                self.log.debug("lost-worker watch: %s", exc)


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
        self.client, self.timeout_s = client, timeout_s
        #: why the run stops (one line), once every worker has been gone for ``timeout_s``
        self.gone: str | None = None
        self._futures: list = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None
        #: how the watch ends the run: the futures the flow waits on cancelled (:mod:`..abort`)
        self.abort = Abort(self._cancel_waited)

    def _cancel_waited(self) -> None:
        with self._lock:
            futures = self._futures
        self.client.cancel(futures)

    def __enter__(self) -> NoWorkers:
        if self.timeout_s is not None:
            # in this thread's context: the flow run's logger goes with it
            context = contextvars.copy_context()
            self._thread = threading.Thread(target=context.run, args=(self._watch,), name="e3p-no-workers", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.abort.close()
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
            line = (
                f"no Dask worker for {self.timeout_s:g} s (the last, {names}, left at {left_at}) and none came "
                "back, so the run stops; the finished shards are kept, run again to resume "
                "(parallel.no_worker_timeout_s: how long to wait; null waits forever)"
            )
            self.abort.fire(Espnet3PrefectError(line), before_stop=functools.partial(self._gone, line))
            return

    def _gone(self, line: str) -> None:
        with self._lock:
            self.gone = line
        get_logger().error("%s", line)
