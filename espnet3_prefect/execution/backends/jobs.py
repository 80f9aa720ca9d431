"""The batch jobs of one flow run: their names, the scheduler's queue, cancelling them, their logs.

Every worker job of a flow run is named ``<prefix>-<run tag>`` (prefix ``e3p`` unless
``options.job_name`` sets one; the tag is the last 10 hex digits of the flow run id), so the
queue says which run owns a job and cleanup finds a run's jobs without any in-memory state.
"""

from __future__ import annotations

import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from espnet3_prefect._internal.proc import CommandError

JOB_PREFIX = "e3p"
LOG_DIRNAME = ".dask-jobs"
TAG_LENGTH = 10
CANCEL_WAIT_S = 60.0
TAIL_LINES = 15


# ----------------------------------------------------------------------------- names


def run_tag(flow_run_id: Any | None = None) -> str:
    """The last hex digits of the flow run id (random in uuid4 and uuid7 alike); random without a run.

    >>> run_tag("0190b0c6-1c2d-7e3f-8a4b-5c6d7e8f9a0b")
    '6d7e8f9a0b'
    """
    hex_id = str(flow_run_id).replace("-", "") if flow_run_id else uuid.uuid4().hex
    return hex_id[-TAG_LENGTH:]


def run_job_name(prefix: str | None, flow_run_id: Any | None = None) -> str:
    """``<prefix or e3p>-<run tag>``: the name of every batch job of one flow run.

    >>> run_job_name("asr", "0190b0c6-1c2d-7e3f-8a4b-5c6d7e8f9a0b")
    'asr-6d7e8f9a0b'
    """
    return f"{prefix or JOB_PREFIX}-{run_tag(flow_run_id)}"


def tag_of(job_name: str) -> str:
    """The run tag in a job name made by :func:`run_job_name`."""
    return job_name.rsplit("-", 1)[-1]


def current_flow_run_id() -> str | None:
    """The id of the flow run we are in, or None outside of one."""
    try:
        from prefect.runtime import flow_run

        return flow_run.id
    except Exception:  # no Prefect context
        return None


def default_log_directory(log_root: Path, job_name: str) -> Path:
    """Where a run's job logs go unless ``options.log_directory`` says otherwise."""
    return Path(log_root) / LOG_DIRNAME / job_name


# ----------------------------------------------------------------------------- queues


@dataclass(frozen=True)
class QueuedJob:
    job_id: str
    name: str
    state: str
    reason: str = ""


def _ours(job: QueuedJob, tag: str) -> bool:
    return job.name.endswith(f"-{tag}")


class JobQueue:
    """List and cancel the current user's jobs on one batch scheduler (subclass per scheduler)."""

    list_command = ""
    ended_states: tuple[str, ...] = ()

    def available(self) -> bool:
        return shutil.which(self.list_command) is not None

    def jobs(self) -> list[QueuedJob]:
        """Every job of the current user the scheduler lists (raises CommandError if it cannot answer)."""
        raise NotImplementedError

    def cancel(self, job_ids: list[str]) -> None:
        raise NotImplementedError

    def run_jobs(self, tag: str) -> list[QueuedJob]:
        """The jobs of the run ``tag`` the scheduler lists."""
        return [j for j in self.jobs() if _ours(j, tag)]

    def cancel_run(self, tag: str, wait_s: float = CANCEL_WAIT_S) -> list[QueuedJob]:
        """Cancel every job of the run ``tag`` and wait until none is listed; returns what is left."""
        if not self.available():
            return []
        deadline = time.monotonic() + wait_s
        asked: set[str] = set()
        while True:
            try:
                left = self.run_jobs(tag)
            except CommandError:
                return []  # the scheduler does not answer: nothing we can do from here
            if not left or time.monotonic() > deadline:
                return left
            fresh = [j.job_id for j in left if j.job_id not in asked]
            if fresh:
                self.cancel(fresh)
                asked.update(fresh)
            time.sleep(0.5)


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
