"""Watching a run's batch jobs while the flow runs, polling the scheduler with back-off.

The queue is asked after 2 s, then 4, 8, 16, 32 s and every 60 s after that; whenever something
changes (a job is listed, changes state or leaves the queue, a worker connects, a submission is
rejected) the next poll comes 2 s later again. A quiet run of an hour costs about 65 queue
calls instead of 1,800 at a fixed 2 s.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable
from pathlib import Path

from espnet3_prefect._internal.proc import CommandError
from espnet3_prefect.errors import Espnet3PrefectError, one_line
from espnet3_prefect.execution.backends.jobqueue import submission_error_text
from espnet3_prefect.execution.backends.jobs import describe_job_logs, job_log_files, tag_of, tail

FIRST_POLL_S = 2.0
MAX_POLL_S = 60.0
START_WARN_S = 120.0  # log the jobs' queue states this often until a worker connects
RETIRED_MARK = "worker-lifetime-reached"  # what a dask worker logs when its --lifetime is up


class Backoff:
    """Poll intervals that double up to a cap and start over when something changed.

    >>> backoff = Backoff(2, 60)
    >>> [backoff.next(changed=False) for _ in range(7)]
    [2, 4, 8, 16, 32, 60, 60]
    >>> backoff.next(changed=True), backoff.next(changed=False)
    (2, 4)
    """

    def __init__(self, first_s: float = FIRST_POLL_S, max_s: float = MAX_POLL_S, factor: float = 2):
        self.first_s, self.max_s, self.factor = first_s, max(first_s, max_s), factor
        self._next: float | None = None

    def next(self, changed: bool) -> float:
        """The wait before the next poll, given whether the last poll saw a change."""
        if changed or self._next is None:
            self._next = self.first_s
        current = self._next
        self._next = min(self.max_s, current * self.factor)
        return current


class JobWatcher(threading.Thread):
    """Polls the scheduler for this run's jobs and reports the ones that end while the flow runs.

    ``backend``: the run's :class:`~espnet3_prefect.execution.backends.base.Backend` (its ``queue`` may be
    None: then only rejected submissions and connecting workers are watched). ``abort`` is called
    once the run cannot get a worker; :attr:`error` then says why.
    """

    def __init__(
        self,
        backend,
        job_name: str,
        log_dir: Path,
        cluster,
        logger,
        expected_jobs: int,
        abort: Callable[[], None],
        poll_s: float = FIRST_POLL_S,
        max_poll_s: float = MAX_POLL_S,
        start_warn_s: float | None = None,
        submit_errors: list | None = None,
    ):
        super().__init__(name=f"e3p-job-watcher-{job_name}", daemon=True)
        self.env, self.queue = backend.name, backend.queue
        self.job_name, self.log_dir, self.cluster = job_name, Path(log_dir), cluster
        self.logger, self.expected_jobs, self.abort = logger, max(1, expected_jobs), abort
        self.backoff = Backoff(poll_s, max_poll_s)
        self.start_warn_s = START_WARN_S if start_warn_s is None else start_warn_s
        self.tag = tag_of(job_name)
        self.started = time.time()
        self.error: Espnet3PrefectError | None = None
        self.first_worker_s: float | None = None
        self.ended: list[str] = []
        self.submit_errors = submit_errors if submit_errors is not None else []
        self._reported_submit_errors = 0
        self._said: set[str] = set()
        self._seen: set[str] = set()
        self._last_view: tuple = ()
        self._halt = threading.Event()
        # The flow's context goes with the thread: without its Prefect settings (the API URL) the
        # thread's log lines would start a temporary Prefect server of their own and land there.
        self._context = contextvars.copy_context()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=30)

    def run(self) -> None:
        self._context.run(self._watch)

    def _watch(self) -> None:
        next_warn = self.started + self.start_warn_s
        changed = True
        while not self._halt.wait(self.backoff.next(changed)):
            changed = False
            try:
                changed = self.poll()
                if self.first_worker_s is None and time.time() >= next_warn:
                    next_warn = time.time() + self.start_warn_s
                    self._warn_no_worker()
            except CommandError as exc:
                self.logger.debug("job watcher: %s", one_line(exc))
            except Exception as exc:  # never let the watcher die silently
                self.logger.warning("job watcher: %s: %s", type(exc).__name__, one_line(exc))
            if self.error is not None:
                return

    def _submitted(self) -> set[str]:
        ids = set()
        for job in list(getattr(self.cluster, "workers", {}).values()):
            job_id = getattr(job, "job_id", None)
            if job_id:
                ids.add(str(job_id))
        return ids

    def _connected(self) -> int:
        try:
            return len(self.cluster.scheduler_info.get("workers", {}))
        except Exception:
            return 0

    def poll(self) -> bool:
        """Look once; report what ended, fail the run when it cannot get a worker.
        True when something changed since the last look (the next one then comes soon)."""
        submitted = self._submitted()  # before asking the queue: a job submitted meanwhile is listed
        connected = self._connected()
        if self.first_worker_s is None and connected:
            self.first_worker_s = time.time() - self.started
            self.logger.info("first worker connected %.1f s after the cluster started", self.first_worker_s)
        failed = self.submit_errors[self._reported_submit_errors :]
        self._reported_submit_errors += len(failed)
        for text in dict.fromkeys(submission_error_text(exc) for exc in failed):  # each message once per poll
            if text not in self._said:
                self._said.add(text)
                self.logger.warning("the %s scheduler rejected a worker job: %s", self.env, text)
        if failed and self.first_worker_s is None and not submitted:
            self.error = Espnet3PrefectError(
                f"parallel.env {self.env!r}: the scheduler rejected the worker jobs: "
                f"{submission_error_text(failed[0])[:1500]}"
            )
            self.logger.error("%s", self.error)
            self.abort()
            return True
        listed = {}
        if self.queue is not None and self.queue.available():
            listed = {j.job_id: j for j in self.queue.run_jobs(self.tag)}
            running = {i for i, j in listed.items() if j.state not in self.queue.ended_states}
            self._seen |= submitted | set(listed)
            for job_id in sorted(self._seen - running - set(self.ended), key=lambda i: int(i) if i.isdigit() else 0):
                self.ended.append(job_id)
                self._report_ended(job_id)
            if self.first_worker_s is None and len(self.ended) >= self.expected_jobs:
                self._fail()
        view = (
            frozenset(submitted),
            connected,
            len(self.submit_errors),
            frozenset((i, j.state) for i, j in listed.items()),
            len(self.ended),
        )
        changed, self._last_view = view != self._last_view, view
        return changed

    def _report_ended(self, job_id: str) -> None:
        files = job_log_files(self.log_dir, job_id, self.job_name, self.started)
        if any(RETIRED_MARK in tail(path, lines=10_000, max_chars=10**6) for path in files):
            self.logger.info(
                "worker job %s (%s) retired before its walltime; a new job replaces it", job_id, self.job_name
            )
        else:
            self.logger.warning(
                "worker job %s (%s) left the queue while the flow was running:\n%s",
                job_id,
                self.job_name,
                describe_job_logs(self.log_dir, job_id, self.job_name, self.started),
            )

    def _warn_no_worker(self) -> None:
        states = []
        if self.queue is not None and self.queue.available():
            states = [
                f"{j.job_id} {j.state}{f' ({j.reason})' if j.reason and j.reason != 'None' else ''}"
                for j in self.queue.run_jobs(self.tag)
            ]
        self.logger.warning(
            "no Dask worker connected %.0f s after submitting the jobs named %s; queue: %s; job logs in %s",
            time.time() - self.started,
            self.job_name,
            ", ".join(states) or "none of our jobs listed",
            self.log_dir,
        )

    def _fail(self) -> None:
        first = self.ended[0]
        logs = describe_job_logs(self.log_dir, first, self.job_name, self.started)
        self.error = Espnet3PrefectError(
            f"every worker job ({', '.join(self.ended)}) ended before a Dask worker connected; "
            f"log of job {first}: {one_line(logs)[-1500:]}"
        )
        self.logger.error("%s", self.error)
        self.abort()
