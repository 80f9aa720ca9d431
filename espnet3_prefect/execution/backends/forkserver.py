"""Local workers forked from one process that has already imported what they run.

A Dask nanny starts its worker with Python's ``spawn`` by default: a fresh interpreter per worker,
which then imports Prefect, prefect-dask and our task modules (~2 s of CPU each). With the flows'
``forkserver_preload`` (:class:`~espnet3_prefect.execution.backends.base.ClusterContext`), ``env: local`` starts
this process's fork server once, with those modules imported in it, and holds Dask's
``distributed.worker.multiprocessing-method: forkserver`` while the cluster lives: every worker is
a fork of that server, so N workers on this machine pay the imports once, and a later run in the
same process pays nothing. Workers stay separate processes (their own pid and memory; a crash ends
only that worker, and its nanny starts it again from the same server).

What a fork does not get by itself, this module hands over:

* the environment: a forked worker inherits the fork server's environment, taken when the server
  started, not the driver's now. :func:`worker_environ` is the nanny's ``env`` (the driver's
  environment at cluster start, then the user's ``options.env``) with the list of its names, and
  :func:`adopt_environ`, run in the worker by our preload, drops what the driver no longer has and
  lets Prefect re-read its settings. The fork server itself starts with Dask's pre-spawn variables
  (``distributed.nanny.pre-spawn-environ``: thread counts, allocator), as a spawned worker would;
* Dask's own preloads and a user's ``preload`` / ``WorkerPlugin`` run in each worker as before, ours
  first (their modules are imported in the worker, not in the fork server).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Iterable, Mapping

METHOD_KEY = "distributed.worker.multiprocessing-method"
#: names of the variables a worker keeps (set by :func:`worker_environ`, read by :func:`adopt_environ`)
KEYS_VAR = "ESPNET3_PREFECT_WORKER_ENV_KEYS"
#: the stage's modules the fork server imports (comma-separated, set by :func:`start` for the server
#: only; read by its preload, :func:`espnet3_prefect.tasks.preload.stage_modules_to_import`)
STAGE_MODULES_VAR = "ESPNET3_PREFECT_STAGE_MODULES"
_LOCK = threading.Lock()
_preloaded: tuple[str, ...] | None = None


def pre_spawn_environ() -> dict[str, str]:
    """Dask's pre-spawn variables a spawned worker would start with (the driver's own values win).

    >>> import dask
    >>> with dask.config.set({"distributed.nanny.pre-spawn-environ": {"E3P_DOC_X": 1, "E3P_DOC_Y": None}}):
    ...     pre_spawn_environ()
    {'E3P_DOC_X': '1'}
    """
    import dask

    wanted = dask.config.get("distributed.nanny.pre-spawn-environ", default={}) or {}
    return {k: os.environ.get(k, str(v)) for k, v in wanted.items() if v is not None}


def start(modules: Iterable[str], stage_modules: Iterable[str] = (), environ: Mapping[str, str] | None = None) -> bool:
    """Start this process's fork server with ``modules`` imported in it (once per process: a running
    one is reused, and restarted by Python if it died). True when workers can fork from it.

    Python imports ``modules`` itself (one that is not installed is skipped). ``stage_modules`` (a
    stage's own classes) reach the server's preload through :data:`STAGE_MODULES_VAR`, which imports
    each where it can: a module that fails there is imported, and fails, in the worker as before.
    ``environ``: variables the server starts with beside this process's (this process keeps its own).
    It returns at once: the server imports in its own process, beside what this one does next."""
    global _preloaded
    modules = tuple(modules)
    stage_modules = tuple(stage_modules)
    with _LOCK:
        from multiprocessing import forkserver

        if _preloaded is None:
            multiprocessing.get_context("forkserver").set_forkserver_preload(["distributed.nanny", *modules])
            _preloaded = modules
            _keep_dask_from_preloading()
        saved = {}
        extra = {**(environ or {}), **pre_spawn_environ()}
        if stage_modules:
            extra[STAGE_MODULES_VAR] = ",".join(stage_modules)
        for name, value in extra.items():  # only while the server starts: not for the driver
            saved[name] = os.environ.get(name)
            os.environ[name] = value
        try:
            forkserver.ensure_running()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
    return True


def _keep_dask_from_preloading() -> None:
    """Dask's first forkserver context imports numpy, pandas and lz4 here to preload them into a
    server that is not started yet; ours is, with what the workers need, so skip that."""
    import distributed.utils

    if hasattr(distributed.utils, "_forkserver_preload_set"):
        distributed.utils._forkserver_preload_set = True


def settings() -> dict:
    """The Dask setting that makes nannies fork their workers from the fork server."""
    return {METHOD_KEY: "forkserver"}


def worker_environ(theirs: Mapping | None = None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The nanny's ``env`` for a forked worker: the driver's environment, then ``theirs`` (the user's
    ``options.env``), and :data:`KEYS_VAR` naming them all.

    >>> env = worker_environ({"B": 2}, environ={"A": "1"})
    >>> env["A"], env["B"], env[KEYS_VAR]
    ('1', '2', 'A,B,ESPNET3_PREFECT_WORKER_ENV_KEYS')
    """
    env = {**(os.environ if environ is None else environ), **{k: str(v) for k, v in (theirs or {}).items()}}
    env[KEYS_VAR] = ""
    env[KEYS_VAR] = ",".join(sorted(env))
    return env


def adopt_environ() -> list[str]:
    """In a forked worker: drop the variables the fork server had but the driver did not hand over
    (Dask's pre-spawn and ``distributed.nanny.environ`` ones stay), and let Prefect, imported in the
    fork server, read its settings from this environment. Returns the names dropped; nothing in a
    worker started without :func:`worker_environ`."""
    keys = os.environ.get(KEYS_VAR)
    if keys is None:
        return []
    import dask

    kept = set(keys.split(","))
    for section in ("distributed.nanny.pre-spawn-environ", "distributed.nanny.environ"):
        kept.update(dask.config.get(section, default={}) or {})
    dropped = sorted(name for name in os.environ if name not in kept)
    for name in dropped:
        del os.environ[name]
    import sys

    if "prefect" in sys.modules:
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()
    return dropped
