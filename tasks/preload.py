"""Dask worker preload: a worker imports what our tasks need while it starts, not in its first task.

Named in ``preload`` of the local cluster (:func:`espnet3_prefect.execution.cluster.open_task_runner`), so
Dask imports this module in every worker process and calls :func:`dask_setup` before the worker
takes work. Without it, each worker paid ~1.4-2 s of CPU importing Prefect, prefect-dask and our
task modules when it unpickled its first task: on the first worker inside ``build-env``, on every
other one after ``build-env`` had returned, one after the other on the flow's critical path. With
it, the workers import in parallel while the cluster starts.

After the imports the import-time objects are frozen out of the garbage collector
(:func:`gc.freeze`): later collections, and the collection at interpreter exit (which made a worker
process that had imported Prefect take 1-4 s to exit after the flow closed the cluster, long enough
for the nanny to kill it), skip them. The collector stays on for everything the tasks create.

On ``env: local`` the flows also name :mod:`espnet3_prefect.tasks.forkserver_warm` as the fork
server's preload (:mod:`espnet3_prefect.execution.backends.forkserver`): :func:`warm_up` runs once in that
server, and every worker forked from it starts with the modules imported and frozen.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys

from espnet3_prefect.execution.backends.forkserver import STAGE_MODULES_VAR

#: imported by :func:`warm_up`: the worker side of the task runner, the Prefect task engine (imported
#: lazily by the first task run) and every task module a worker runs
MODULES = (
    "espnet3_prefect.execution.task_runner",
    "prefect.task_engine",
    "espnet3_prefect.tasks.build_env",
    "espnet3_prefect.tasks.run_shard",
)

#: set on the worker by :func:`dask_setup` (tests read it through ``client.run``)
WARMED = "espnet3_prefect_warmed"


def warm_up(stage_modules: tuple[str, ...] = ()) -> list[str]:
    """Import :data:`MODULES` (with the collector paused, it only slows importing down) and freeze what
    exists now out of later collections. On the main thread, so ``dask_jobqueue`` (imported by
    espnet3's classes) may install its signal handler. Returns the modules imported by this call.
    ``stage_modules`` (the fork server's: :func:`stage_modules_to_import`) are imported first, each
    where it can: one that fails is left to the worker's own import, where its error is reported."""
    from espnet3_prefect.execution.rundir import preload_on_main_thread

    missing = [name for name in MODULES if name not in sys.modules]
    imported = []
    enabled = gc.isenabled()
    gc.disable()
    try:
        preload_on_main_thread()
        for name in (n for n in stage_modules if n not in sys.modules):
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - the worker imports it again and reports what fails
                continue
            imported.append(name)
        for name in missing:
            importlib.import_module(name)
    finally:
        if enabled:
            gc.enable()
    gc.freeze()
    return imported + missing


def stage_modules_to_import(environ=None) -> tuple[str, ...]:
    """The stage modules the driver named for the fork server (:data:`STAGE_MODULES_VAR`).

    >>> stage_modules_to_import({STAGE_MODULES_VAR: "espnet2.bin.asr_inference,my_recipe.model"})
    ('espnet2.bin.asr_inference', 'my_recipe.model')
    """
    value = (os.environ if environ is None else environ).get(STAGE_MODULES_VAR, "")
    return tuple(name for name in value.split(",") if name)


def dask_setup(worker) -> None:
    """Dask's preload hook: in a worker forked from the fork server, take the driver's environment
    (:func:`~espnet3_prefect.execution.backends.forkserver.adopt_environ`); then :func:`warm_up` in the worker
    process (nothing left to import after a fork), before it runs any task; then :func:`quiet_after_ctrl_c`."""
    from espnet3_prefect.execution.backends.forkserver import adopt_environ

    adopt_environ()
    setattr(worker, WARMED, warm_up())
    quiet_after_ctrl_c()
    one_line_per_outage()


def one_line_per_outage() -> None:
    """While the Prefect server is unreachable, a worker's Prefect clients report every event they keep
    for later (a warning, then the whole event at ERROR: pages per shard on the run's terminal) and every
    batch of log lines they drop ("--- Error logging to API ---" on stderr, as the logging module does
    for a handler's error). The events are sent when the server is back; the log lines stay in the
    stage's log files; the driver's watch says the outage once. So the worker drops those reports."""
    import logging

    logging.getLogger("prefect.events.clients").addFilter(_not_an_outage_report)
    logging.getLogger("prefect._internal.concurrency").addFilter(_not_an_outage_report)
    logging.raiseExceptions = False  # the API log handler's drops only: a worker has no other handler that fails


def _not_an_outage_report(record) -> bool:
    message = record.getMessage()
    return not ("Unable to connect to" in message or "'EventsWorker' failed to process item" in message)


def quiet_after_ctrl_c() -> None:
    """A terminal's Ctrl-C reaches every process of its foreground group, local workers included: each
    printed a KeyboardInterrupt traceback, and then Dask's notes on the tasks the driver cancelled, while
    the driver, which the Ctrl-C is for, stops them anyway (it closes the cluster; a batch scheduler or
    the nanny ends the others with SIGTERM). The worker keeps running and goes quiet: its stdout and
    stderr go to /dev/null (what it sends to the Prefect API is unchanged)."""
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _quiet)


def _quiet(signum, frame) -> None:
    import os

    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, fd)
        os.close(devnull)
