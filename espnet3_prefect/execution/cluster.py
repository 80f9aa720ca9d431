"""The cluster around a flow: started at once, its batch jobs watched, and no job left behind.

For batch-scheduler envs (:attr:`Backend.batch <espnet3_prefect.execution.backends.base.Backend.batch>`)
:func:`open_task_runner`

* names every worker job after the flow run (``e3p-<last 10 hex digits of the flow run id>``;
  ``options.job_name`` replaces ``e3p``), so a job in ``squeue``/``qstat``/``oarstat`` says which run owns it
  and cleanup can find the run's jobs without any in-memory state;
* puts the scheduler's job logs in ``<inference_dir>/.dask-jobs/<job name>/`` unless
  ``options.log_directory`` is set;
* starts the cluster at once and watches its jobs (:mod:`espnet3_prefect.execution.backends.watcher`): a
  job that leaves the queue while the flow runs has the tail of its log written to the flow's
  log; when every job of the first wave ended before any worker connected (a broken prologue, a
  wrong python path), or the scheduler rejected the submissions, the flow fails with that reason
  instead of waiting forever;
* on the way out, whether the flow succeeded, failed, crashed or was cancelled, closes the
  cluster (dask-jobqueue cancels the jobs it knows) and then cancels whatever job of this run
  is still queued, by name, and waits until the queue no longer lists any.

With ``parallel.tls`` on (the default for batch schedulers and ssh) the run's certificate and key
are made before the cluster starts (:mod:`espnet3_prefect.execution.backends.tls`: ``<job log
folder>/tls-<job name>/``, or a private temporary folder for ssh) and removed on the way out, last.

:func:`cancel_jobs_hook` does the last step from a flow run alone; it is the flow's
``on_cancellation`` / ``on_crashed`` hook, which Prefect also runs in a runner process when
the flow's own process was killed.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from espnet3_prefect.errors import ConfigError, Espnet3PrefectError, one_line
from espnet3_prefect.execution import backends
from espnet3_prefect.execution.abort import Abort
from espnet3_prefect.execution.backends import forkserver
from espnet3_prefect.execution.backends.base import Backend, ClusterContext
from espnet3_prefect.execution.backends.jobs import current_flow_run_id, run_job_name, run_tag, tag_of
from espnet3_prefect.execution.backends.tls import RunCertificates
from espnet3_prefect.execution.backends.watcher import JobWatcher
from espnet3_prefect.execution.spec import ParallelSpec, build_task_runner


@contextlib.contextmanager
def open_task_runner(
    spec: ParallelSpec,
    *,
    log_root: Path,
    logger,
    worker_preload: tuple[str, ...] = (),
    forkserver_preload: tuple[str, ...] = (),
    stage_modules: tuple[str, ...] = (),
) -> Iterator[Any]:
    """The flow's ``DaskTaskRunner``, started; batch jobs watched and always cleaned up.

    ``log_root`` is the inference dir (the default job logs go under it). ``worker_preload``: modules
    each worker imports while it starts, on the backends that take a ``preload`` (see
    :class:`~espnet3_prefect.execution.backends.base.ClusterContext`); ``forkserver_preload``: modules imported
    once in the fork server that ``env: local`` workers are forked from, and ``stage_modules`` (the
    stage's own, each where it can: :func:`start_fork_server`). For a running
    scheduler (``address``) and the local backends this is the plain runner of
    :func:`build_task_runner`. On every backend a failure to close the cluster after another
    error (workers too slow to stop) is logged, never raised in place of that error.
    """
    backend = None if spec.address else backends.get(spec.env)
    certificates: list[RunCertificates] = []
    try:
        with _opened(
            spec, backend, log_root, logger, certificates, worker_preload, forkserver_preload, stage_modules
        ) as runner:
            yield runner
    finally:
        for certs in certificates:
            certs.remove()


def start_fork_server(
    spec: ParallelSpec,
    forkserver_preload: tuple[str, ...],
    stage_modules: tuple[str, ...] = (),
    environ: dict[str, str] | None = None,
) -> bool:
    """Start now the fork server that ``env: local`` / ``local_gpu`` workers will be forked from
    (:mod:`~espnet3_prefect.execution.backends.forkserver`), with ``forkserver_preload`` and the stage's
    ``stage_modules``; ``environ``: variables it starts with beside this process's (the run's
    ``PREFECT_HOME``). It imports in its own process, beside whatever this one does next (waiting
    for a Prefect server to start); the run's cluster finds it running. False, and nothing started,
    on the other backends. Not for a stage with nothing to run: it costs a core for seconds.
    """
    backend = None if spec.address else backends.get(spec.env)
    if backend is None or backend.batch or not forkserver_preload:
        return False
    context = ClusterContext(
        forkserver_preload=forkserver_preload, stage_modules=stage_modules, forkserver_environ=environ
    )
    return bool(backend.dask_settings(spec, context).get(forkserver.METHOD_KEY))


def _certificates(
    spec: ParallelSpec, backend: Backend | None, job_name: str, folder: str | None, made: list, logger
) -> RunCertificates | None:
    """This run's certificate files when it uses TLS with files (appended to ``made`` for removal)."""
    if backend is None or not backend.tls_files or not backend.uses_tls(spec):
        return None
    certs = RunCertificates.temporary(job_name) if folder is None else RunCertificates.in_folder(folder, job_name)
    made.append(certs)
    if folder is not None:
        certs.create()
    logger.info(
        "scheduler and workers talk TLS; this run's certificate is in %s (removed when the run ends)", certs.directory
    )
    return certs


@contextlib.contextmanager
def _opened(
    spec: ParallelSpec,
    backend: Backend | None,
    log_root: Path,
    logger,
    made: list,
    worker_preload: tuple[str, ...],
    forkserver_preload: tuple[str, ...] = (),
    stage_modules: tuple[str, ...] = (),
) -> Iterator[Any]:
    if backend is None or not backend.batch:
        job_name = run_job_name(spec.options.get("job_name"), current_flow_run_id())
        certs = _certificates(spec, backend, job_name, None, made, logger)
        context = ClusterContext(
            certificates=certs,
            worker_preload=worker_preload,
            forkserver_preload=forkserver_preload,
            stage_modules=stage_modules,
        )
        with _dask_settings(backend, spec, context), _entered(build_task_runner(spec, context), logger) as runner:
            if backend is not None and backend.start_at_once:
                _start(runner, backend)  # a remote start fails here, on one line with a hint
            yield runner
        return
    job_name = run_job_name(spec.options.get("job_name"), current_flow_run_id())
    log_dir = Path(backend.log_directory(spec, log_root, job_name))
    folder = backend.certificate_folder(spec, ClusterContext(job_name=job_name, log_directory=str(log_dir)))
    certs = _certificates(spec, backend, job_name, folder, made, logger)
    submit_errors: list = []
    runner = build_task_runner(
        spec,
        ClusterContext(
            job_name=job_name,
            log_directory=str(log_dir),
            submit_errors=submit_errors,
            certificates=certs,
            worker_preload=worker_preload,
        ),
    )
    try:
        with _entered(runner, logger):
            started = time.monotonic()
            client = _start(runner, backend)
            processes = int(spec.options.get("processes") or 1)
            jobs = -(-spec.n_workers // processes)
            logger.info(
                "cluster up in %.1f s; asked %s for %d worker job(s) named %s; job logs in %s",
                time.monotonic() - started,
                spec.env,
                jobs,
                job_name,
                log_dir,
            )
            # the watcher's way to end the run: the Dask client closed, once, never after its stop
            abort = Abort(client.close)
            watcher = JobWatcher(
                backend,
                job_name,
                log_dir,
                client.cluster,
                logger,
                expected_jobs=jobs,
                abort=lambda: abort.fire(watcher.error),
                submit_errors=submit_errors,
            )
            watcher.start()
            try:
                yield runner
            except BaseException:
                if abort.error is not None:
                    raise abort.error from None
                raise
            finally:
                abort.close()
                watcher.stop()
    finally:
        if backend.queue is not None:
            left = backend.queue.cancel_run(tag_of(job_name))
            if left:
                logger.warning(
                    "jobs of this run still listed after cancelling them: %s",
                    ", ".join(f"{j.job_id} ({j.state})" for j in left),
                )


def cancel_jobs_hook(flow, flow_run, state) -> None:
    """Flow hook (on_cancellation, on_crashed): cancel the batch jobs named after ``flow_run``.

    Needs nothing but the flow run id, so it also works in a Prefect runner process after the
    flow's own process was killed. Every scheduler whose commands exist here is asked.
    """
    log = logging.getLogger("espnet3_prefect")
    tag = run_tag(flow_run.id)
    for backend in backends.batch():
        if backend.queue is None:
            continue
        try:
            left = backend.queue.cancel_run(tag)
        except Exception as exc:  # a hook must not raise
            log.warning("cancelling %s jobs of run %s failed: %s", backend.name, tag, one_line(exc))
            continue
        if left:
            log.warning(
                "%s jobs of run %s still listed after cancelling: %s",
                backend.name,
                tag,
                ", ".join(f"{j.job_id} ({j.state})" for j in left),
            )


def _dask_settings(backend: Backend | None, spec: ParallelSpec, context: ClusterContext | None = None):
    """The backend's Dask settings (:meth:`Backend.dask_settings`), held while the cluster lives."""
    settings = backend.dask_settings(spec, context) if backend is not None else {}
    if not settings:
        return contextlib.nullcontext()
    import dask

    return dask.config.set(settings)


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
            logger.warning(
                "closing the cluster after the error failed too: %s: %s", type(close_exc).__name__, one_line(close_exc)
            )
        raise
    runner.__exit__(None, None, None)


def _start(runner, backend: Backend):
    """Create the cluster now (prefect-dask would on the first submit) and turn start errors into one line."""
    try:
        return runner.client
    except Espnet3PrefectError:
        raise
    except Exception as exc:
        hint = backend.start_error_hint(exc)
        error = ConfigError if hint else Espnet3PrefectError
        raise error(
            f"parallel.env {backend.name!r}: cannot start the cluster: {type(exc).__name__}: "
            f"{one_line(exc)[:800]}{hint}"
        ) from None
