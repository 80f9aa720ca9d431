"""A prefect-dask ``DaskTaskRunner`` with a per-task cost of milliseconds, not ~0.2 s.

Measured with cProfile on 2 cores, a task submitted through prefect-dask 0.3.7 costs:

- ~0.1 s on the driver re-serializing Prefect's *settings* (constant during a flow run), plus
  ~20 ms for Dask to hash that serialized context into the task key;
- ~0.1 s on the worker rebuilding the settings model from that copy, and ~70 ms creating a new
  API client (a fresh TLS context loading the CA bundle) because worker threads have none.

:class:`ShardTaskRunner` submits tasks through :func:`run_prefect_task` instead. The driver's
settings still travel with every task, exactly as prefect-dask sends them, so a worker sees the
driver's API URL whether it came from the environment, a profile or ``temporary_settings``; but
they are serialized once per settings object and shipped beside the task context rather than
inside it (the task context is serialized with a stand-in whose settings serialize to nothing).
Each worker process rebuilds a given settings object once and keeps one API client for it. Task
keys are random (every task run is unique), so Dask hashes nothing. Task runs, states, retries,
caching, asset events and results stay Prefect's own (``run_task_sync``/``run_task_async``).

``tests/integration/test_task_runner_contract.py`` holds this runner to ``DaskTaskRunner``'s
behaviour, with the API URL in the environment and only in the settings.

This module is the one place that reads Prefect's private names (``SettingsContext.__var__``,
``SyncClientContext``, ``serialize_context``, the task engine's ``run_task_sync``, an unbound
``distributed.Client.submit``). It is version-gated: with a prefect or prefect-dask outside
:data:`TESTED` (what those names were read against and the contract tests pass on), or without one of
the names, :class:`ShardTaskRunner` submits as ``DaskTaskRunner`` does, with one warning, and keeps
its other behaviour. Callers say which argument classes never hold a future with
:func:`never_holds_futures`, instead of a marker attribute on the class.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import re
import threading
import uuid
from collections.abc import Iterator
from importlib import metadata
from typing import Any

from prefect.context import SettingsContext, SyncClientContext
from prefect_dask import DaskTaskRunner
from prefect_dask.task_runners import PrefectDaskFuture

log = logging.getLogger("espnet3_prefect")

# ----------------------------------------------------------------------------- the version gate

#: distribution -> (lowest version, first version not covered): the releases whose private names the
#: fast submit path was read against, as pyproject.toml pins them
TESTED = {"prefect": ((3, 8, 8), (3, 10)), "prefect-dask": ((0, 3, 7), (0, 4))}


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string (pre-release and local parts dropped).

    >>> release("3.9.1"), release("0.3.7.dev2"), release("3.10.0rc1")
    ((3, 9, 1), (0, 3, 7), (3, 10, 0))
    """
    return tuple(int(part) for part in re.findall(r"\d+", version.split("+")[0].split("rc")[0])[:3])


def untested_versions(installed: dict[str, str]) -> list[str]:
    """The ``name version`` of each installed distribution outside :data:`TESTED`.

    >>> untested_versions({"prefect": "3.9.1", "prefect-dask": "0.3.7"})
    []
    >>> untested_versions({"prefect": "3.10.2", "prefect-dask": "0.3.7"})
    ['prefect 3.10.2']
    """
    out = []
    for name, (low, stop) in TESTED.items():
        if not low <= release(installed[name]) < stop:
            out.append(f"{name} {installed[name]}")
    return out


@functools.cache
def fast_path_problem() -> str | None:
    """Why the fast submit path is off here (None: it is on): an untested prefect or prefect-dask, or a
    private name it reads that this Prefect lacks."""
    untested = untested_versions({name: metadata.version(name) for name in TESTED})
    if untested:
        return f"{', '.join(untested)} is outside the tested range"
    try:
        from prefect.context import serialize_context  # noqa: F401
        from prefect.task_engine import run_task_async, run_task_sync  # noqa: F401
        from prefect.utilities.engine import collect_task_run_inputs_sync  # noqa: F401
    except ImportError as exc:
        return f"this Prefect lacks {exc.name or exc}"
    if not hasattr(SettingsContext, "__var__") or not hasattr(SyncClientContext, "__var__"):
        return "this Prefect's contexts have no __var__"
    return None


# ----------------------------------------------------------------------------- which arguments hold no future

_NO_FUTURES: set[type] = set()


def never_holds_futures(*classes: type) -> None:
    """Register argument classes whose instances never hold a future (frozen, plain values): ``submit``
    leaves such arguments out of Prefect's search for upstream futures, which walks every field of every
    argument on every submit (~5-13 ms per shard task for a stage's work object)."""
    _NO_FUTURES.update(classes)


# ----------------------------------------------------------------------------- driver side


class _SettingsShippedApart(SettingsContext):
    """The current settings, serialized to nothing: the task context leaves them out, and
    :func:`run_prefect_task` gets them beside it. Set only while one task context is serialized,
    in the submitting thread's context: nothing else in the process sees it."""

    def serialize(self, include_secrets: bool = True) -> dict[str, Any]:
        return {}


class _Shipped:
    """The settings of one ``SettingsContext`` as sent to workers: serialized once, under a key."""

    def __init__(self, context: SettingsContext):
        self.context = context  # held, so its id() is not reused while cached
        self.payload = (uuid.uuid4().hex, context.serialize(include_secrets=True))
        self.stand_in = _SettingsShippedApart(profile=context.profile, settings=context.settings)


_SHIPPED: dict[int, _Shipped] = {}
_SHIPPED_LOCK = threading.Lock()


def _shipped(context: SettingsContext) -> _Shipped:
    with _SHIPPED_LOCK:
        hit = _SHIPPED.get(id(context))
        if hit is None or hit.context is not context:
            if len(_SHIPPED) >= 8:
                _SHIPPED.clear()
            hit = _SHIPPED[id(context)] = _Shipped(context)
        return hit


@contextlib.contextmanager
def settings_shipped_apart() -> Iterator[tuple[str, dict] | None]:
    """Within the block (this thread's context only), task contexts serialize without settings;
    yields ``(key, serialized settings)`` to send beside them (None without a settings context)."""
    current = SettingsContext.get()
    if current is None:
        yield None
        return
    shipped = _shipped(current)
    token = SettingsContext.__var__.set(shipped.stand_in)
    try:
        yield shipped.payload
    finally:
        SettingsContext.__var__.reset(token)


class Opaque:
    """A task argument Dask passes through without looking inside: it scans arguments for futures,
    node by node (a few ms for a serialized task context and settings), and these hold none."""

    __slots__ = ("value",)

    def __init__(self, value: Any):
        self.value = value

    def __reduce__(self):
        return Opaque, (self.value,)


def _searched(parameters: dict) -> dict:
    """The arguments that may hold a future (those of a class :func:`never_holds_futures` names do not).

    >>> class Plain: pass
    >>> never_holds_futures(Plain)
    >>> sorted(_searched({"a": Plain(), "b": [1]}))
    ['b']
    """
    return {k: v for k, v in parameters.items() if type(v) not in _NO_FUTURES}


# ----------------------------------------------------------------------------- worker side

WORKER_CONTEXTS_KEPT = 4  # settings objects (and their API clients) a worker process keeps


class _WorkerContexts:
    """The driver's settings rebuilt in this worker process, and one API client made under them."""

    def __init__(self, payload: dict):
        self.settings = SettingsContext(**payload)
        token = SettingsContext.__var__.set(self.settings)
        try:
            self.client = SyncClientContext()  # its API URL, key and TLS options: these settings'
            self.client.client.__enter__()
        finally:
            SettingsContext.__var__.reset(token)
        self.users = 0

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.client.client.__exit__(None, None, None)


_WORKER_CONTEXTS: dict[str, _WorkerContexts] = {}  # by settings key, oldest first
_WORKER_LOCK = threading.Lock()


@contextlib.contextmanager
def _worker_contexts(settings: tuple[str, dict]) -> Iterator[_WorkerContexts]:
    """Built once per settings key and process; the oldest unused ones beyond a few are closed."""
    key, payload = settings
    with _WORKER_LOCK:
        entry = _WORKER_CONTEXTS.pop(key, None) or _WorkerContexts(payload)
        _WORKER_CONTEXTS[key] = entry  # newest last
        entry.users += 1
        for old_key in list(_WORKER_CONTEXTS)[:-WORKER_CONTEXTS_KEPT]:
            if _WORKER_CONTEXTS[old_key].users == 0:
                _WORKER_CONTEXTS.pop(old_key).close()
    try:
        yield entry
    finally:
        with _WORKER_LOCK:
            entry.users -= 1


def run_prefect_task(task, *, settings: Opaque, context: Opaque, **run_task_kwargs):
    """Run a Prefect task on a Dask worker under the driver's settings and this process's API client
    (``settings``: ``(key, serialized settings)`` or None; ``context``: the serialized task context)."""
    from prefect.task_engine import run_task_async, run_task_sync

    run_task_kwargs["context"] = context.value
    with contextlib.ExitStack() as stack:
        if settings.value is not None:
            contexts = stack.enter_context(_worker_contexts(settings.value))
            for var, value in (
                (SettingsContext.__var__, contexts.settings),
                (SyncClientContext.__var__, contexts.client),
            ):
                stack.callback(var.reset, var.set(value))
        if task.isasync:
            return asyncio.run(run_task_async(task=task, **run_task_kwargs))
        return run_task_sync(task=task, **run_task_kwargs)


DRAIN_TIMEOUT_S = 5.0  # per Prefect service, on each worker, once when the cluster closes


def drain_prefect_services(timeout_s: float = DRAIN_TIMEOUT_S) -> None:
    """On a worker: send the task-run events and logs Prefect still queues in the background. A batch
    job is cancelled as soon as the flow is done; without this the last task runs of a worker are
    finished in Dask but never recorded by the server (seen on SLURM: the events of a shard that
    ended 0.1 s before ``scancel`` were lost). Runs in its own thread (``Client.run`` calls it on the
    worker's event loop, where Prefect's drains only schedule themselves)."""
    import sys

    if "prefect" not in sys.modules:
        return

    def drain() -> None:
        from prefect.events.worker import EventsWorker
        from prefect.logging.handlers import APILogWorker

        for service in (EventsWorker, APILogWorker):
            with contextlib.suppress(Exception):
                service.drain_all(timeout=timeout_s)

    thread = threading.Thread(target=drain, name="e3p-drain-prefect", daemon=True)
    thread.start()
    thread.join(2 * timeout_s + 1)


class ShardTaskRunner(DaskTaskRunner):
    """``DaskTaskRunner`` with cheap submission (see the module docstring); same options.

    >>> ShardTaskRunner(cluster_kwargs={"n_workers": 1}).cluster_kwargs
    {'n_workers': 1}
    """

    def __enter__(self):
        # A worker holds only the tasks it runs (Dask's default 1.1 queues a second one). Shards
        # are coarse, so nothing is lost; and when a worker dies, Dask counts the death against
        # every task on it: with queued tasks, an innocent shard could be declared killed.
        import dask

        super().__enter__()
        self._exit_stack.enter_context(dask.config.set({"distributed.scheduler.worker-saturation": 1.0}))
        return self

    def __exit__(self, *exc_info) -> None:
        if self._client is not None:  # before the cluster closes (and batch jobs are cancelled)
            with contextlib.suppress(Exception):
                self._client.run(drain_prefect_services, on_error="ignore")
        super().__exit__(*exc_info)

    def submit(self, task, parameters, wait_for=None, dependencies=None, *, priority: int = 0):
        """Prefect's ``submit``; ``priority``: Dask's (higher first among the tasks waiting for a worker)."""
        problem = fast_path_problem()
        if problem is not None:  # another Prefect release: the stock submit (no priority: plan order)
            _warn_once(problem)
            return super().submit(task, parameters, wait_for=wait_for, dependencies=dependencies)
        if not self._started:
            raise RuntimeError("The task runner must be started before submitting work.")
        from distributed import Client, Future
        from prefect.context import serialize_context
        from prefect.utilities.engine import collect_task_run_inputs_sync

        searched = _searched(parameters)
        parameters = {**parameters, **self._optimize_futures(searched)}
        wait_for = self._optimize_futures(wait_for) if wait_for else None
        inputs = {
            k: collect_task_run_inputs_sync(v, future_cls=Future) if k in searched else set()
            for k, v in parameters.items()
        }
        for name, extra in (dependencies or {}).items():
            inputs[name] = inputs.get(name, set()) | extra
        task_run_id = uuid.uuid4()
        with settings_shipped_apart() as settings:
            context = serialize_context(
                asset_ctx_kwargs={
                    "task": task,
                    "task_run_id": task_run_id,
                    "task_inputs": inputs,
                    "copy_to_child_ctx": True,
                }
            )
        future = Client.submit(
            self.client,
            run_prefect_task,
            task,
            key=f"{task.name}-{task_run_id.hex}",
            pure=False,
            priority=priority,
            settings=Opaque(settings),
            task_run_id=task_run_id,
            parameters=parameters,
            wait_for=wait_for,
            return_type="state",
            dependencies=inputs,
            context=Opaque(context),
        )
        future.task_run_id = (
            task_run_id  # how Prefect finds upstream runs among Dask futures (asset lineage, task inputs)
        )
        return PrefectDaskFuture(wrapped_future=future, task_run_id=task_run_id)


# ----------------------------------------------------------------------------- the flow's heartbeat thread

_HEARTBEATS_UNJOINED = False


def heartbeats_unjoined() -> bool:
    """Let a sync flow run end without waiting for Prefect's heartbeat thread (True once installed).

    Prefect's sync flow engine keeps a daemon thread that emits the flow run's heartbeat; the thread
    looks at its stop event once a second, and the engine joins it when the flow function returns:
    on average half a second, up to a second, added to every flow run (measured here: 0.4-1.0 s
    between the function's return and the run's end, ``python -m benchmarks.run_phases``). Prefect's
    async engine does not join it (``join_on_exit=False``); this makes the sync engine do the same.
    The thread still stops at its next look (a daemon: the process never waits for it) and, as
    before, emits no heartbeat once the run is final or stopped. Installed for this process only,
    within :data:`TESTED` and where Prefect has that function with that switch; else nothing changes.
    """
    global _HEARTBEATS_UNJOINED
    if _HEARTBEATS_UNJOINED:
        return True
    if fast_path_problem() is not None:
        return False
    import inspect

    from prefect import flow_engine

    original = getattr(flow_engine, "_send_heartbeats", None)
    if original is None or "join_on_exit" not in inspect.signature(original).parameters:
        return False

    @functools.wraps(original)
    def unjoined(engine, join_on_exit: bool = True):
        return original(engine, join_on_exit=False)

    flow_engine._send_heartbeats = unjoined
    _HEARTBEATS_UNJOINED = True
    return True


@functools.cache
def _warn_once(problem: str) -> None:
    log.warning("%s: tasks are submitted as prefect-dask's DaskTaskRunner does (~0.2 s more per task)", problem)
