"""A stage as one job: a zero-argument callable (one of ESPnet3's stages, with its system and configs)
run in a process of its own, on this machine or as one batch job, while the driver waits, forwards its
output line by line, and cancels it when told to.

Nouns, as in submitit: :class:`JobPaths` (the job's folder: the payload, the script, the output, the
result), :class:`StageJob` (submit, state, cancel), :class:`ProcessJob` (``env: local``: a child process
in a session of its own) and :class:`BatchJob` (a batch scheduler: the job script dask-jobqueue writes
for one worker with the same options, its worker command replaced by ours), and :func:`wait_for`.

The job runs ``python -m espnet3_prefect.execution.stage_job <folder>``: it unpickles the payload
(``(setup, call)``, cloudpickled by the driver with the configs as the driver holds them, a resume
checkpoint included), runs it, and writes ``result.json`` atomically, ``{"state": "done"}`` or
``{"state": "failed", "error": "<type: first line>"}``. That record is the one truth of the job's
outcome: a job that left the queue without one died (cancelled, preempted, out of walltime), and the
driver says which job and the scheduler's last word on it.

    >>> import tempfile
    >>> paths = JobPaths(Path(tempfile.mkdtemp()) / "train")
    >>> write_payload(paths, print, None)
    >>> job = ProcessJob(paths, cwd=Path.cwd()); job_id = job.submit()
    >>> wait_for(job, paths).state
    'done'
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from espnet3_prefect._internal.atomic import atomic_write_text
from espnet3_prefect.errors import Espnet3PrefectError, describe

#: where a stage's job folders go, inside the stage's log folder (never one of its outputs)
JOBS_DIRNAME = ".stage-jobs"
POLL_S = 1.0
#: after a job left the queue, how long its result file may take to show (a shared file system's lag)
RESULT_GRACE_S = 10.0
CANCEL_WAIT_S = 30.0
PLACEHOLDER_SCHEDULER = "tcp://unused:0"
#: where a job finds its own id (SLURM, SGE, PBS, LSF, OAR)
JOB_ID_VARIABLES = ("SLURM_JOB_ID", "JOB_ID", "PBS_JOBID", "LSB_JOBID", "OAR_JOB_ID")


class JobFailed(Espnet3PrefectError):
    """The job ended without finishing its stage: the stage raised in it, or the job died."""


class JobCancelled(Espnet3PrefectError):
    """The driver was told to stop while the job ran; the job is cancelled and gone."""


@dataclass(frozen=True)
class JobPaths:
    """The files of one stage job, in one folder the job and the driver share."""

    folder: Path

    @property
    def payload(self) -> Path:
        return self.folder / "payload.pkl"

    @property
    def script(self) -> Path:
        return self.folder / "job.sh"

    @property
    def output(self) -> Path:
        return self.folder / "job.out"

    @property
    def result(self) -> Path:
        return self.folder / "result.json"

    def fresh(self) -> JobPaths:
        """Empty the folder (a former attempt's files) and create it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for path in (self.payload, self.script, self.output, self.result):
            path.unlink(missing_ok=True)
        return self

    def read_result(self) -> dict | None:
        try:
            return json.loads(self.result.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None


def write_payload(paths: JobPaths, call: Callable[[], Any], setup: Callable[[], Any] | None) -> None:
    """Pickle what the job runs (cloudpickle: closures and classes made at run time travel by value)."""
    import cloudpickle

    paths.fresh()
    tmp = paths.payload.with_name(f".{paths.payload.name}.tmp-{os.getpid()}")
    tmp.write_bytes(cloudpickle.dumps((setup, call)))
    os.replace(tmp, paths.payload)


def job_command(paths: JobPaths, cwd: Path, python: str = sys.executable) -> str:
    """The shell line a job runs: in ``cwd``, this package's job entry, its output appended to ``job.out``."""
    folder = shlex.quote(str(paths.folder.resolve()))
    out = shlex.quote(str(paths.output.resolve()))
    return f"cd {shlex.quote(str(cwd.resolve()))} && exec {shlex.quote(python)} -m {__name__} {folder} >> {out} 2>&1"


def job_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The driver's environment with ``PYTHONPATH`` naming every folder of its ``sys.path``: the job
    imports the modules the driver imported (the recipe's ``src``, the system's class). A batch job
    gets the variables a worker job gets (:data:`~espnet3_prefect.execution.backends.base.EXPORTED_ENV`)."""
    environ = dict(os.environ if environ is None else environ)
    folders = [p for p in sys.path if p and os.path.isdir(p) and not _of_the_interpreter(p)]
    given = [p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*given, *folders]))
    return environ


def _of_the_interpreter(folder: str) -> bool:
    """A folder the job's interpreter has on its path by itself: its standard library, its packages,
    the folder of its own scripts."""
    here = os.path.realpath(folder)
    own = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    scripts = os.path.dirname(os.path.realpath(sys.executable))
    return here == scripts or any(here == p or here.startswith(os.path.realpath(p) + os.sep) for p in own)


# ----------------------------------------------------------------------------- the jobs


class StageJob:
    """One job running a stage's payload. Subclasses say how it starts, what state it is in (None once
    it is gone), how it ended, and how it is stopped."""

    kind = "job"
    job_id: str | None = None
    #: after the job is gone, how long its result file may take to show here
    result_grace_s = RESULT_GRACE_S

    def submit(self) -> str:
        raise NotImplementedError

    def state(self) -> str | None:
        raise NotImplementedError

    def final_state(self) -> str:
        """The scheduler's word on a job that is gone (when it keeps one)."""
        return "gone from the queue"

    def cancel(self) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        return f"{self.kind} {self.job_id}"


class ProcessJob(StageJob):
    """``env: local``: the payload in a child process of this machine, in a session of its own (a
    cancel stops it and every process it started)."""

    kind = "process"
    result_grace_s = 0.0  # the process wrote its result before it exited, on this machine

    def __init__(self, paths: JobPaths, cwd: Path, environ: Mapping[str, str] | None = None):
        self.paths, self.cwd = paths, cwd
        self.environ = job_environment() if environ is None else dict(environ)
        self.process: subprocess.Popen | None = None

    def submit(self) -> str:
        command = job_command(self.paths, self.cwd)
        self.paths.script.write_text(f"#!/bin/sh\n{command}\n", encoding="utf-8")
        self.process = subprocess.Popen(["/bin/sh", str(self.paths.script)], env=self.environ, start_new_session=True)
        self.job_id = str(self.process.pid)
        return self.job_id

    def state(self) -> str | None:
        return "RUNNING" if self.process is not None and self.process.poll() is None else None

    def final_state(self) -> str:
        code = self.process.returncode if self.process is not None else None
        if code is not None and code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exited with code {code}"

    def cancel(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue


class BatchJob(StageJob):
    """One job of a batch scheduler (``env: slurm``, ``sge``, ``pbs``, ``lsf``, ``oar``, ...), written
    by the backend as it writes a worker's job (its directives, our defaults under the user's options,
    the exported variables), with the stage's command where the worker's would be."""

    def __init__(self, backend: Any, spec: Any, paths: JobPaths, job_name: str, cwd: Path, environ=None):
        self.backend, self.spec, self.paths, self.job_name, self.cwd = backend, spec, paths, job_name, cwd
        self.environ = job_environment() if environ is None else dict(environ)
        self.kind = f"{backend.name.upper()} job"
        self._job: Any = None
        self.last_state: str | None = None

    def job(self) -> Any:
        """The dask-jobqueue Job object (built once; submitting it runs the scheduler's submit command)."""
        if self._job is None:
            self._job = build_job(self.backend, self.spec, self.job_name, self.paths, self.cwd, self.environ)
        return self._job

    def script(self) -> str:
        """What is submitted, as ``cluster-script`` shows it (for OAR, the ``oarsub`` line)."""
        return self.backend.submitted_text(self.job().job_script())

    def submit(self) -> str:
        job = self.job()
        self.paths.script.write_text(job.job_script(), encoding="utf-8")
        asyncio.run(job.start())
        self.job_id = str(job.job_id)
        return self.job_id

    def state(self) -> str | None:
        from espnet3_prefect._internal.proc import CommandError

        try:
            listed = {job.job_id: job for job in self.backend.queue.jobs()}
        except CommandError:
            return self.last_state or "UNKNOWN"  # the scheduler did not answer this time: ask again
        found = listed.get(self.job_id)
        if found is None or found.state in self.backend.queue.ended_states:
            if found is not None:
                self.last_state = found.state
            return None
        self.last_state = found.state
        return found.state

    def final_state(self) -> str:
        from espnet3_prefect._internal.proc import CommandError

        ended = getattr(self.backend.queue, "final_state", None)
        try:
            said = ended(self.job_id) if ended is not None else None
        except CommandError:
            said = None
        if said:
            return said
        return f"gone from the queue (last seen {self.last_state})" if self.last_state else "gone from the queue"

    def cancel(self) -> None:
        if self.job_id is None:
            return
        deadline = time.monotonic() + CANCEL_WAIT_S
        self.backend.queue.cancel([self.job_id])
        while self.state() is not None and time.monotonic() < deadline:
            time.sleep(0.5)

    def describe(self) -> str:
        return f"{self.kind} {self.job_id} ({self.job_name})"


def build_job(backend: Any, spec: Any, job_name: str, paths: JobPaths, cwd: Path, environ: Mapping[str, str]):
    """dask-jobqueue's Job for one worker of ``spec`` (one job, no TLS: no Dask scheduler is involved),
    named ``job_name``, running :func:`job_command` instead of a Dask worker."""
    from espnet3_prefect.execution.backends.base import ClusterContext

    context = ClusterContext(job_name=job_name, log_directory=str(paths.folder.resolve()), environ=environ)
    kwargs = backend.cluster_kwargs(replace(spec, n_workers=1, tls=False), context)
    job_cls = kwargs.pop("job_cls", None) or backend.load_cluster_class().job_cls
    accepted = _init_keywords(job_cls)
    job = job_cls(scheduler=PLACEHOLDER_SCHEDULER, name=job_name, **{k: v for k, v in kwargs.items() if k in accepted})
    import dask

    # the interpreter a worker of these options would run (options.python, dask-jobqueue's config, ours)
    python = kwargs.get("python") or dask.config.get(f"jobqueue.{job.config_name}.python", None) or sys.executable
    job._command_template = job_command(paths, cwd, python)  # dask-jobqueue's script template puts it last
    return job


def _init_keywords(cls: type) -> set[str]:
    names: set[str] = set()
    for klass in cls.__mro__:
        init = vars(klass).get("__init__")
        if init is not None:
            names |= {
                p.name
                for p in inspect.signature(init).parameters.values()
                if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
            }
    return names - {"self", "scheduler", "name", "worker_command", "worker_extra_args", "security", "protocol"}


# ----------------------------------------------------------------------------- waiting


@dataclass
class JobOutcome:
    """How a stage job ended: ``state`` (``done``), its id, and the seconds its payload ran (the job's
    own clock, queue time excluded)."""

    job_id: str
    state: str
    running_s: float


def wait_for(
    job: StageJob,
    paths: JobPaths,
    *,
    on_line: Callable[[str], None] | None = None,
    stop: threading.Event | None = None,
    poll_s: float = POLL_S,
) -> JobOutcome:
    """Wait until the job's result is written or the job is gone, passing each new line of its output to
    ``on_line``. Raises :class:`JobFailed` (the stage's error, or which job died and how) or
    :class:`JobCancelled` (``stop`` was set: the job is cancelled first). Ctrl-C cancels the job too."""
    offset, gone_at = 0, None
    try:
        while True:
            offset = _forward(paths.output, offset, on_line)
            result = paths.read_result()
            if result is not None:
                break
            if stop is not None and stop.is_set():
                job.cancel()
                raise JobCancelled(f"{job.describe()} cancelled")
            if job.state() is None:
                gone_at = gone_at or time.monotonic()
                if time.monotonic() - gone_at >= job.result_grace_s:
                    _forward(paths.output, offset, on_line)
                    raise JobFailed(
                        f"{job.describe()} ended {job.final_state()} before the stage finished; its output: "
                        f"{paths.output}"
                    )
            time.sleep(poll_s)
    except KeyboardInterrupt:
        job.cancel()
        raise
    _forward(paths.output, offset, on_line)
    running_s = float(result.get("ended_at", 0.0)) - float(result.get("started_at", 0.0))
    if result.get("state") != "done":
        raise JobFailed(str(result.get("error") or f"{job.describe()} failed"))
    return JobOutcome(str(job.job_id), "done", round(running_s, 1))


def _forward(path: Path, offset: int, on_line: Callable[[str], None] | None) -> int:
    """Pass the whole new lines of ``path`` after ``offset`` to ``on_line``; returns the new offset."""
    try:
        with open(path, "rb") as handle:
            handle.seek(offset)
            data = handle.read()
    except OSError:
        return offset
    end = data.rfind(b"\n") + 1
    if on_line is not None:
        for line in data[:end].decode("utf-8", errors="replace").splitlines():
            on_line(line)
    return offset + end


# ----------------------------------------------------------------------------- inside the job


def main(argv: list[str] | None = None) -> int:
    """The job's entry: run the payload in ``argv[0]``'s folder, write ``result.json``."""
    import cloudpickle

    paths = JobPaths(Path((argv if argv is not None else sys.argv[1:])[0]))
    result: dict[str, Any] = {"host": os.uname().nodename, "pid": os.getpid(), "started_at": time.time()}
    found = [os.environ[name] for name in JOB_ID_VARIABLES if os.environ.get(name)]
    result["job_id"] = found[0] if found else None  # the scheduler's id of this job, read inside it
    try:
        setup, call = cloudpickle.loads(paths.payload.read_bytes())
        if setup is not None:
            setup()
        call()
    except Exception as exc:
        import traceback

        traceback.print_exc()
        result.update(state="failed", error=describe(exc))
    else:
        result.update(state="done")
    result["ended_at"] = time.time()
    atomic_write_text(paths.result, json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0 if result["state"] == "done" else 1


if __name__ == "__main__":
    sys.exit(main())


__all__ = [
    "JOBS_DIRNAME",
    "BatchJob",
    "JobCancelled",
    "JobFailed",
    "JobOutcome",
    "JobPaths",
    "ProcessJob",
    "StageJob",
    "build_job",
    "job_command",
    "wait_for",
    "write_payload",
]
