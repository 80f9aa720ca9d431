"""The dask-jobqueue family: workers are batch jobs (slurm, pbs, sge, lsf, htcondor, moab, oar).

One module per scheduler subclasses :class:`JobqueueBackend` with its cluster class, walltime
format and, where we can ask it, its queue commands. Shared here:

* checks of ``parallel.options`` that dask-jobqueue would only report deep inside a traceback
  (a string where a list belongs, unparsable memory, a walltime YAML turned into a number);
* our defaults for the cluster keyword arguments (logs in a known folder, worker dashboards on
  loopback, the Prefect API URL and PYTHONPATH exported in the job script, workers that retire
  before the walltime, TLS with the run's certificate files unless ``parallel.tls: false``: the
  job script names the files, ``--tls-cert``/``--tls-key``, never their contents). The user's
  options always win, except ``job_name``, which becomes the prefix of the per-run job name so
  that cleanup can find this run's jobs;
* a Job class that records the submissions the scheduler rejected (dask-jobqueue only logs them).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping
from typing import Any

from espnet3_prefect._internal.util import CLIENT_FILE_PRELOAD, SECRET_VARS, without_secrets
from espnet3_prefect.errors import one_line
from espnet3_prefect.execution.backends.allocator import allocator_exports
from espnet3_prefect.execution.backends.base import (
    LOOPBACK_DASHBOARD,
    Backend,
    ClusterContext,
    exported_environment,
    keyword_names,
    needs_preload,
    option_error,
)
from espnet3_prefect.execution.backends.tls import RunCertificates
from espnet3_prefect.execution.backends.walltime import Lifetime, WalltimeFormat, worker_lifetime

LIST_OPTIONS = (
    "job_extra_directives",
    "job_script_prologue",
    "worker_extra_args",
    "job_directives_skip",
    "job_extra",
    "env_extra",
    "header_skip",
    "extra",
)


class JobqueueBackend(Backend):
    batch = True
    start_at_once = True
    no_worker_timeout_s = 3600.0  # replacement jobs (the cluster adapts) may wait in the queue
    tls_default = tls_supported = tls_files = True
    walltime: WalltimeFormat | None = None  # None: dask-jobqueue gives these jobs no walltime
    required_options: tuple[tuple[str, str], ...] = ()  # (key, example) besides cores and memory
    mapping_options: tuple[str, ...] = ()  # list options this scheduler also takes as a mapping

    @property
    def has_walltime(self) -> bool:
        return self.walltime is not None

    def valid_options(self) -> set[str] | None:
        cluster = self.load_cluster_class()  # first: it imports dask_jobqueue keeping Ctrl-C's handler
        from dask_jobqueue.core import Job, JobQueueCluster

        return keyword_names(JobQueueCluster, cluster, cluster.job_cls, Job)

    def _configured(self, key: str) -> Any:
        import dask

        return dask.config.get(f"jobqueue.{self.name}.{key}", None)

    def check_options(self, options: dict, lifetime_margin_s: float | None) -> None:
        """Unknown names first, then the common misconfigurations, each on one line."""
        from dask.utils import parse_bytes

        from espnet3_prefect._internal.util import is_int

        super().check_options(options, lifetime_margin_s)
        for key in LIST_OPTIONS:
            value = options.get(key)
            if value is None or (key in self.mapping_options and isinstance(value, Mapping)):
                continue
            if isinstance(value, str) or not isinstance(value, (list, tuple)):
                raise option_error(
                    key,
                    f"must be a list of strings, got {type(value).__name__} {value!r} (write it as [{value!r}])"
                    if isinstance(value, str)
                    else f"must be a list of strings, got {type(value).__name__}",
                )
            bad = [v for v in value if not isinstance(v, (str, int, float))]
            if bad:
                raise option_error(key, f"must be a list of strings, got an item {bad[0]!r}")
        cores, memory = (
            options.get("cores", self._configured("cores")),
            options.get("memory", self._configured("memory")),
        )
        if cores is None or memory is None:
            missing = "cores" if cores is None else "memory"
            raise option_error(
                missing, f"required for env {self.name!r} (cores and memory per job, e.g. cores: 4, memory: 16GB)"
            )
        if not is_int(cores) or cores <= 0:
            raise option_error("cores", f"must be a positive integer, got {cores!r}")
        try:
            if parse_bytes(str(memory)) <= 0:
                raise ValueError
        except (ValueError, TypeError):
            raise option_error("memory", f"cannot read {memory!r} as an amount of memory (e.g. 16GB, 512MiB)") from None
        processes = options.get("processes")
        if processes is not None:
            if not is_int(processes) or processes <= 0:
                raise option_error("processes", f"must be a positive integer, got {processes!r}")
            if processes > cores:
                raise option_error(
                    "processes", f"{processes} worker processes per job need at least as many cores, got cores: {cores}"
                )
        for key, example in self.required_options:
            if options.get(key, self._configured(key)) is None:
                raise option_error(key, f"required for env {self.name!r} ({example})")
        walltime_s = self.walltime_seconds_of(options)
        if walltime_s is not None and lifetime_margin_s is not None:
            worker_lifetime(walltime_s, lifetime_margin_s)  # raises when the margin leaves nothing

    def effective_walltime(self, options: Mapping[str, Any]) -> Any:
        """The walltime jobs will get: ``options.walltime`` or dask-jobqueue's configured default."""
        if self.walltime is None:
            return None
        return options["walltime"] if "walltime" in options else self._configured("walltime")

    def walltime_seconds(self, value: Any) -> int:
        """Seconds in a walltime written the way this scheduler reads it."""
        return self.walltime.seconds(value, self.name)

    def walltime_seconds_of(self, options: Mapping[str, Any]) -> int | None:
        walltime = self.effective_walltime(options)
        return None if walltime is None else self.walltime_seconds(walltime)

    def lifetime(self, spec) -> Lifetime | None:
        walltime_s = self.walltime_seconds_of(spec.options)
        return None if walltime_s is None else worker_lifetime(walltime_s, spec.lifetime_margin_s)

    def cluster_kwargs(self, spec, context: ClusterContext) -> dict[str, Any]:
        """Our defaults under the user's options; the per-run job name; the rejected-submission recorder."""
        options = dict(spec.options)
        kwargs: dict[str, Any] = {}
        if context.log_directory is not None:
            kwargs["log_directory"] = context.log_directory
        scheduler_options = {"dashboard_address": LOOPBACK_DASHBOARD, **(options.pop("scheduler_options", None) or {})}
        worker_args = [str(a) for a in options.pop("worker_extra_args", None) or []]
        if not _has_flag(worker_args, "--dashboard-address", "--no-dashboard", "--dashboard"):
            worker_args += ["--dashboard-address", LOOPBACK_DASHBOARD]
        lifetime = self.lifetime(spec)
        if lifetime is not None and not _has_flag(worker_args, "--lifetime"):
            worker_args += lifetime.worker_args()
        exported = exported_environment(context.environ)
        if needs_preload(exported) and CLIENT_FILE_PRELOAD not in worker_args:
            worker_args += ["--preload", CLIENT_FILE_PRELOAD]
        exports = [f"export {k}={shlex.quote(v)}" for k, v in {**allocator_exports(), **exported}.items()]
        prologue = exports + [str(line) for line in options.pop("job_script_prologue", None) or []]
        options.pop("job_name", None)  # used as the prefix of job_name
        options.pop("shared_temp_directory", None)  # where the certificate folder goes (certificate_folder)
        if self.uses_tls(spec):
            certs = context.certificates or RunCertificates.in_folder(
                self.certificate_folder(spec, context), context.job_name
            )
            kwargs.update(security=certs.security(), protocol="tls://")
        self.adjust_options(options, options.get("log_directory") or kwargs.get("log_directory"), context.job_name)
        kwargs.update(options)
        kwargs.update(
            scheduler_options=scheduler_options,
            worker_extra_args=worker_args,
            job_name=context.job_name,
            n_workers=spec.n_workers,
        )
        if prologue:
            kwargs["job_script_prologue"] = prologue
        base = self.load_cluster_class().job_cls
        environ = os.environ if context.environ is None else context.environ
        job_cls = self.submit_job_class(
            secret_free_job_class(base) if any(environ.get(k) for k in SECRET_VARS) else base
        )
        if context.submit_errors is not None:
            job_cls = recording_job_class(job_cls, context.submit_errors)
        if job_cls is not base:
            kwargs["job_cls"] = job_cls
        return kwargs

    def certificate_folder(self, spec, context: ClusterContext) -> str | None:
        """``options.shared_temp_directory``, else the run's job log folder (``options.log_directory`` or
        the default one): a path the compute nodes share."""
        import os

        options = spec.options
        return str(
            options.get("shared_temp_directory") or options.get("log_directory") or context.log_directory or os.getcwd()
        )

    def log_directory(self, spec, log_root, job_name: str) -> str:
        """Where this run's job logs go: ``options.log_directory``, else ``<log_root>/.dask-jobs/<job name>``."""
        from espnet3_prefect.execution.backends.jobs import default_log_directory

        return str(spec.options.get("log_directory") or default_log_directory(log_root, job_name))

    def adjust_options(self, options: dict, log_dir: str | None, job_name: str) -> None:
        """Scheduler-specific rewriting of ``options`` (in place) before they reach the cluster, e.g.
        naming the log files where dask-jobqueue's script ignores ``log_directory`` (OAR)."""

    def submit_job_class(self, base: type) -> type:
        """The Job class to submit with, given dask-jobqueue's ``base``: ``base`` itself unless the
        scheduler needs its commands called differently (OAR)."""
        return base

    def preview(self, spec, kwargs: Mapping[str, Any]) -> tuple[str, str]:
        from espnet3_prefect.execution.backends.preview import render_job_script

        return "job script", render_job_script(self.load_cluster_class(), kwargs)


def _has_flag(args: list, *flags: str) -> bool:
    return any(str(a).split("=", 1)[0] in flags for a in args)


def secret_free_job_class(base: type) -> type:
    """A subclass of dask-jobqueue's Job class ``base`` whose queue commands (sbatch, qsub, scancel...)
    run without the Prefect credentials in their environment: SLURM copies the submitter's environment
    into the job, where accounting (``sacct --env-vars``) may show it. Workers read the client file."""

    class SecretFreeJob(base):
        @staticmethod
        async def _call(cmd, *, shell=False, **kwargs):
            kwargs["env"] = without_secrets(kwargs.get("env") or os.environ)
            return await base._call(cmd, shell=shell, **kwargs)

    SecretFreeJob.__name__ = SecretFreeJob.__qualname__ = base.__name__
    return SecretFreeJob


def recording_job_class(base: type, errors: list) -> type:
    """A subclass of dask-jobqueue's Job class ``base`` that appends its submission errors to ``errors``.

    dask-jobqueue submits jobs in the background and only logs a rejected ``sbatch``/``qsub``;
    the flow would wait for workers forever. The job watcher reads ``errors`` instead.
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
    """The scheduler's own words from a failed submission (dask-jobqueue wraps them in a long message).

    >>> submission_error_text(RuntimeError("Command exited...\\nstderr:\\nqsub: Unknown queue\\n"))
    'qsub: Unknown queue'
    """
    text = str(exc)
    if "stderr:" in text:
        text = text.split("stderr:", 1)[1]
    return one_line(text) or type(exc).__name__
