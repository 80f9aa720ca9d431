"""Cluster lifecycle around the flow: named batch jobs, their logs, and no job left behind.

For batch-scheduler envs (dask-jobqueue) :func:`open_task_runner`

* names every worker job after the flow run (``e3p-<last 10 hex digits of the flow run id>``;
  ``options.job_name`` replaces ``e3p``), so a job in ``squeue``/``qstat`` says which run owns it
  and cleanup can find the run's jobs without any in-memory state;
* puts the scheduler's job logs in ``<inference_dir>/.dask-jobs/<job name>/`` unless
  ``options.log_directory`` is set;
* starts the cluster at once and watches its jobs: a job that leaves the queue while the flow
  runs has the tail of its log written to the flow's log; when every job of the first wave
  ended before any worker connected (a broken prologue, a wrong python path), the flow fails
  with that tail instead of waiting forever; while no worker has connected, the jobs' queue
  states are logged every :data:`START_WARN_S` seconds;
* on the way out, whether the flow succeeded, failed, crashed or was cancelled, closes the
  cluster (dask-jobqueue cancels the jobs it knows) and then cancels whatever job of this run
  is still queued, by name, and waits until the queue no longer lists any.

:func:`cancel_jobs_hook` does the last step from a flow run alone; it is the flow's
``on_cancellation`` / ``on_crashed`` hook, which Prefect also runs in a runner process when
the flow's own process was killed.
"""

from __future__ import annotations

import contextlib
import contextvars
import getpass
import os
import re
import shutil
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ._proc import CommandError, run_command
from .errors import ConfigError, Espnet3PrefectError, one_line
from .parallel import JOBQUEUE_ENVS, ParallelSpec, build_task_runner

JOB_PREFIX = "e3p"
LOG_DIRNAME = ".dask-jobs"
TAG_LENGTH = 10
START_WARN_S = 120.0  # log the jobs' queue states this often until a worker connects
POLL_S = 2.0
CANCEL_WAIT_S = 60.0
TAIL_LINES = 15
RETIRED_MARK = "worker-lifetime-reached"  # what a dask worker logs when its --lifetime is up


# ----------------------------------------------------------------------------- names


def run_tag(flow_run_id: Any | None = None) -> str:
    """The last hex digits of the flow run id (random in uuid4 and uuid7 alike); random without a run.

    >>> run_tag("0190b0c6-1c2d-7e3f-8a4b-5c6d7e8f9a0b")
    '6d7e8f9a0b'
    """
    hex_id = str(flow_run_id).replace("-", "") if flow_run_id else uuid.uuid4().hex
    return hex_id[-TAG_LENGTH:]


def run_job_name(prefix: str | None, flow_run_id: Any | None = None) -> str:
    """``<prefix or e3p>-<run tag>``: the name of every batch job of one flow run."""
    return f"{prefix or JOB_PREFIX}-{run_tag(flow_run_id)}"


def current_flow_run_id() -> str | None:
    """The id of the flow run we are in, or None outside of one."""
    try:
        from prefect.runtime import flow_run

        return flow_run.id
    except Exception:  # no Prefect context
        return None


# ----------------------------------------------------------------------------- queues


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    name: str
    state: str
    reason: str = ""


class _Queue:
    """List and cancel the current user's jobs on one batch scheduler."""

    name = ""
    list_command = ""
    ended_states: tuple[str, ...] = ()

    def available(self) -> bool:
        return shutil.which(self.list_command) is not None

    def jobs(self) -> list[QueuedJob]:
        raise NotImplementedError

    def cancel(self, job_ids: list[str]) -> None:
        raise NotImplementedError


class _Slurm(_Queue):
    name, list_command = "slurm", "squeue"
    ended_states = ("COMPLETING", "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL",
                    "PREEMPTED", "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY")

    def jobs(self) -> list[QueuedJob]:
        out = run_command(["squeue", "-h", "-u", getpass.getuser(), "-o", "%i|%j|%T|%r"], timeout_s=30).stdout
        jobs = []
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 4:
                jobs.append(QueuedJob(*parts))
        return jobs

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            run_command(["scancel", *job_ids], timeout_s=30, check=False)


class _Sge(_Queue):
    name, list_command = "sge", "qstat"
    ended_states = ("d", "dr", "dt", "E", "Eqw")

    def jobs(self) -> list[QueuedJob]:
        out = run_command(["qstat", "-u", getpass.getuser(), "-xml"], timeout_s=30).stdout
        jobs = []
        for entry in ET.fromstring(out).iter("job_list"):
            job_id, name, state = (entry.findtext(k, "").strip() for k in ("JB_job_number", "JB_name", "state"))
            if job_id:
                jobs.append(QueuedJob(job_id, name, state))
        return jobs

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            run_command(["qdel", *job_ids], timeout_s=30, check=False)


QUEUES: dict[str, type[_Queue]] = {"slurm": _Slurm, "sge": _Sge}


def queue_for(env: str) -> _Queue | None:
    """The queue adapter for ``env``; None where we cannot list jobs (pbs, lsf, ... : not tested here)."""
    cls = QUEUES.get(env)
    return cls() if cls is not None else None


def _ours(job: QueuedJob, tag: str) -> bool:
    return job.name.endswith(f"-{tag}")


def run_jobs(env: str, tag: str) -> list[QueuedJob]:
    """This run's jobs still listed by the scheduler of ``env`` (empty where it cannot be asked)."""
    queue = queue_for(env)
    if queue is None or not queue.available():
        return []
    return [j for j in queue.jobs() if _ours(j, tag)]


def cancel_run_jobs(env: str, tag: str, wait_s: float = CANCEL_WAIT_S) -> list[QueuedJob]:
    """Cancel every job of the run ``tag`` and wait until none is listed; returns what is left."""
    queue = queue_for(env)
    if queue is None or not queue.available():
        return []
    deadline = time.monotonic() + wait_s
    asked: set[str] = set()
    while True:
        try:
            left = [j for j in queue.jobs() if _ours(j, tag)]
        except CommandError:
            return []  # the scheduler does not answer: nothing we can do from here
        if not left or time.monotonic() > deadline:
            return left
        fresh = [j.job_id for j in left if j.job_id not in asked]
        if fresh:
            queue.cancel(fresh)
            asked.update(fresh)
        time.sleep(0.5)


def cancel_jobs_hook(flow, flow_run, state) -> None:
    """Flow hook (on_cancellation, on_crashed): cancel the batch jobs named after ``flow_run``.

    Needs nothing but the flow run id, so it also works in a Prefect runner process after the
    flow's own process was killed. Every scheduler whose commands exist here is asked.
    """
    import logging

    log = logging.getLogger("espnet3_prefect")
    tag = run_tag(flow_run.id)
    for env in QUEUES:
        try:
            left = cancel_run_jobs(env, tag)
        except Exception as exc:  # a hook must not raise
            log.warning("cancelling %s jobs of run %s failed: %s", env, tag, one_line(exc))
            continue
        if left:
            log.warning("%s jobs of run %s still listed after cancelling: %s", env, tag,
                        ", ".join(f"{j.job_id} ({j.state})" for j in left))


# ----------------------------------------------------------------------------- logs


def job_log_files(log_dir: Path, job_id: str, job_name: str, since: float) -> list[Path]:
    """The scheduler's log files of one job: the job id as a separate number in the file name,
    and this run's job name in it or written after ``since`` (ids restart on a fresh scheduler)."""
    if not log_dir.is_dir():
        return []
    pattern = re.compile(rf"(?<![0-9]){re.escape(job_id)}(?![0-9])")
    found = []
    for path in sorted(log_dir.iterdir()):
        try:
            recent = path.stat().st_mtime >= since - 1
        except OSError:
            continue
        if path.is_file() and pattern.search(path.name) and (job_name in path.name or recent):
            found.append(path)
    return sorted(found, key=lambda p: (not p.name.endswith((".err", f".e{job_id}")), p.name))


def tail(path: Path, lines: int = TAIL_LINES, max_chars: int = 3000) -> str:
    """The last ``lines`` lines of a text file (at most ``max_chars``)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"<cannot read {path}: {exc.strerror}>"
    return "\n".join(text.splitlines()[-lines:])[-max_chars:]


def describe_job_logs(log_dir: Path, job_id: str, job_name: str, since: float) -> str:
    files = job_log_files(log_dir, job_id, job_name, since)
    if not files:
        return f"no log file for job {job_id} in {log_dir}"
    return "\n".join(f"--- {path} (last lines) ---\n{tail(path)}" for path in files)


# ----------------------------------------------------------------------------- submissions


def recording_job_class(base: type, errors: list) -> type:
    """A subclass of dask-jobqueue's Job class ``base`` that appends its submission errors to ``errors``.

    dask-jobqueue submits jobs in the background and only logs a rejected ``sbatch``/``qsub``;
    the flow would wait for workers forever. The watcher reads ``errors`` instead.
    """

    class RecordingJob(base):
        async def start(self):
            try:
                await super().start()
            except Exception as exc:
                errors.append(exc)
                from distributed.core import Status

                self.status = Status.failed  # lets the cluster close cleanly later
                raise

    RecordingJob.__name__ = RecordingJob.__qualname__ = base.__name__
    return RecordingJob


def submission_error_text(exc: BaseException) -> str:
    """The scheduler's own words from a failed submission (dask-jobqueue wraps them in a long message)."""
    text = str(exc)
    if "stderr:" in text:
        text = text.split("stderr:", 1)[1]
    return one_line(text) or type(exc).__name__


# ----------------------------------------------------------------------------- watcher


class JobWatcher(threading.Thread):
    """Polls the scheduler for this run's jobs and reports the ones that end while the flow runs."""

    def __init__(self, env: str, job_name: str, log_dir: Path, cluster, logger, expected_jobs: int,
                 abort: Callable[[], None], poll_s: float = POLL_S, start_warn_s: float | None = None,
                 submit_errors: list | None = None):
        super().__init__(name=f"e3p-job-watcher-{job_name}", daemon=True)
        self.env, self.job_name, self.log_dir, self.cluster = env, job_name, Path(log_dir), cluster
        self.logger, self.expected_jobs, self.abort, self.poll_s = logger, max(1, expected_jobs), abort, poll_s
        self.start_warn_s = START_WARN_S if start_warn_s is None else start_warn_s
        self.tag = job_name.rsplit("-", 1)[-1]
        self.queue = queue_for(env)
        self.started = time.time()
        self.error: Espnet3PrefectError | None = None
        self.first_worker_s: float | None = None
        self.ended: list[str] = []
        self.submit_errors = submit_errors if submit_errors is not None else []
        self._reported_submit_errors = 0
        self._said: set[str] = set()
        self._seen: set[str] = set()
        self._halt = threading.Event()
        # The flow's context goes with the thread: without its Prefect settings (the API URL) the
        # thread's log lines would start a temporary Prefect server of their own and land there.
        self._context = contextvars.copy_context()

    def stop(self) -> None:
        self._halt.set()
        if self.is_alive():
            self.join(timeout=30)

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

    def run(self) -> None:
        self._context.run(self._watch)

    def _watch(self) -> None:
        next_warn = self.started + self.start_warn_s
        while not self._halt.wait(self.poll_s):
            try:
                self._poll()
                if self.first_worker_s is None and time.time() >= next_warn:
                    next_warn = time.time() + self.start_warn_s
                    self._warn_no_worker()
            except CommandError as exc:
                self.logger.debug("job watcher: %s", one_line(exc))
            except Exception as exc:  # never let the watcher die silently
                self.logger.warning("job watcher: %s: %s", type(exc).__name__, one_line(exc))
            if self.error is not None:
                return

    def _poll(self) -> None:
        submitted = self._submitted()  # before asking the queue: a job submitted meanwhile is listed
        if self.first_worker_s is None and self._connected():
            self.first_worker_s = time.time() - self.started
            self.logger.info("first worker connected %.1f s after the cluster started", self.first_worker_s)
        failed = self.submit_errors[self._reported_submit_errors:]
        self._reported_submit_errors += len(failed)
        for text in dict.fromkeys(submission_error_text(exc) for exc in failed):  # each message once per poll
            if text not in self._said:
                self._said.add(text)
                self.logger.warning("the %s scheduler rejected a worker job: %s", self.env, text)
        if failed and self.first_worker_s is None and not submitted:
            self.error = Espnet3PrefectError(f"parallel.env {self.env!r}: the scheduler rejected the worker jobs: "
                                             f"{submission_error_text(failed[0])[:1500]}")
            self.logger.error("%s", self.error)
            self.abort()
            return
        if self.queue is None or not self.queue.available():
            return
        listed = {j.job_id: j for j in self.queue.jobs() if _ours(j, self.tag)}
        running = {i for i, j in listed.items() if j.state not in self.queue.ended_states}
        self._seen |= submitted | set(listed)
        for job_id in sorted(self._seen - running - set(self.ended), key=lambda i: int(i) if i.isdigit() else 0):
            self.ended.append(job_id)
            self._report_ended(job_id)
        if self.first_worker_s is None and len(self.ended) >= self.expected_jobs:
            self._fail()

    def _report_ended(self, job_id: str) -> None:
        files = job_log_files(self.log_dir, job_id, self.job_name, self.started)
        if any(RETIRED_MARK in tail(path, lines=10_000, max_chars=10**6) for path in files):
            self.logger.info("worker job %s (%s) retired before its walltime; a new job replaces it", job_id, self.job_name)
        else:
            self.logger.warning("worker job %s (%s) left the queue while the flow was running:\n%s",
                                job_id, self.job_name, describe_job_logs(self.log_dir, job_id, self.job_name, self.started))

    def _warn_no_worker(self) -> None:
        states = []
        if self.queue is not None and self.queue.available():
            states = [f"{j.job_id} {j.state}{f' ({j.reason})' if j.reason and j.reason != 'None' else ''}"
                      for j in self.queue.jobs() if _ours(j, self.tag)]
        self.logger.warning("no Dask worker connected %.0f s after submitting the jobs named %s; "
                            "queue: %s; job logs in %s", time.time() - self.started, self.job_name,
                            ", ".join(states) or "none of our jobs listed", self.log_dir)

    def _fail(self) -> None:
        first = self.ended[0]
        logs = describe_job_logs(self.log_dir, first, self.job_name, self.started)
        self.error = Espnet3PrefectError(
            f"every worker job ({', '.join(self.ended)}) ended before a Dask worker connected; "
            f"log of job {first}: {one_line(logs)[-1500:]}")
        self.logger.error("%s", self.error)
        self.abort()


# ----------------------------------------------------------------------------- runner


def default_log_directory(log_root: Path, job_name: str) -> Path:
    return Path(log_root) / LOG_DIRNAME / job_name


@contextlib.contextmanager
def open_task_runner(spec: ParallelSpec, *, log_root: Path, logger) -> Iterator[Any]:
    """The flow's ``DaskTaskRunner``, started; batch jobs watched and always cleaned up.

    ``log_root`` is the inference dir (the default job logs go under it). For env local and
    address this is the plain runner of :func:`build_task_runner`. On every backend a failure to
    close the cluster after another error (workers too slow to stop) is logged, never raised in
    place of that error.
    """
    if spec.env not in JOBQUEUE_ENVS and spec.env != "ssh":
        with _entered(build_task_runner(spec), logger) as runner:
            yield runner
        return
    if spec.env == "ssh":
        with _entered(build_task_runner(spec), logger) as runner:
            _start(runner, spec)
            yield runner
        return
    tag = run_tag(current_flow_run_id())
    job_name = f"{spec.options.get('job_name') or JOB_PREFIX}-{tag}"
    log_dir = Path(spec.options.get("log_directory") or default_log_directory(log_root, job_name))
    runner = build_task_runner(spec, job_name=job_name, log_directory=str(log_dir))
    submit_errors: list = []
    runner.cluster_kwargs["job_cls"] = recording_job_class(runner.resolved_cluster_class.job_cls, submit_errors)
    try:
        with _entered(runner, logger):
            started = time.monotonic()
            client = _start(runner, spec)
            processes = int(spec.options.get("processes") or 1)
            jobs = -(-spec.n_workers // processes)
            logger.info("cluster up in %.1f s; asked %s for %d worker job(s) named %s; job logs in %s",
                        time.monotonic() - started, spec.env, jobs, job_name, log_dir)
            watcher = JobWatcher(spec.env, job_name, log_dir, client.cluster, logger, expected_jobs=jobs,
                                 abort=client.close, submit_errors=submit_errors)
            watcher.start()
            try:
                yield runner
            except BaseException:
                if watcher.error is not None:
                    raise watcher.error from None
                raise
            finally:
                watcher.stop()
    finally:
        left = cancel_run_jobs(spec.env, tag)
        if left:
            logger.warning("jobs of this run still listed after cancelling them: %s",
                           ", ".join(f"{j.job_id} ({j.state})" for j in left))


@contextlib.contextmanager
def _entered(runner, logger) -> Iterator[Any]:
    """``with runner``, except that an error while closing the cluster after another error is only logged."""
    runner.__enter__()
    try:
        yield runner
    except BaseException as exc:
        try:
            runner.__exit__(type(exc), exc, exc.__traceback__)
        except Exception as close_exc:
            logger.warning("closing the cluster after the error failed too: %s: %s", type(close_exc).__name__,
                           one_line(close_exc))
        raise
    runner.__exit__(None, None, None)


def _start(runner, spec: ParallelSpec):
    """Create the cluster now (prefect-dask would on the first submit) and turn start errors into one line."""
    try:
        return runner.client
    except Espnet3PrefectError:
        raise
    except Exception as exc:
        hint = ""
        if spec.env == "ssh":
            name = type(exc).__name__
            if "HostKey" in name or "host key" in str(exc).lower():
                hint = " (check parallel.options.connect_options.known_hosts)"
            elif "Permission" in name or "auth" in str(exc).lower():
                hint = " (check parallel.options.connect_options: username, client_keys)"
        error = ConfigError if hint else Espnet3PrefectError
        raise error(f"parallel.env {spec.env!r}: cannot start the cluster: {type(exc).__name__}: "
                    f"{one_line(exc)[:800]}{hint}") from None
