"""Repair run states Prefect cannot see: shards whose workers died, flow runs whose process died."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("espnet3_prefect")


def mark_task_run_crashed(
    task_run_id,
    message: str,
    *,
    task=None,
    name: str | None = None,
    flow_run_id=None,
    timeout_s: float = 60.0,
    min_attempts: int = 3,
) -> None:
    """Set a task run whose worker was killed to Crashed (prefect#12968), under its own ``name``.

    What the server holds of it depends on which of the dead worker's events arrived. All of them:
    the run is left Running. Only the first (Pending): the run carries the placeholder name a worker
    gives a task run before it renders ``task_run_name`` (``run-shard-a01``, not
    ``run-shard-test_a-3``), so it is renamed here too; that is what a busy server showed (the
    worker's Running event lost with the worker), and the shard was missing from the UI under its
    name. None: it is created here, Crashed, under the same id and name. The server may be busy
    recording the dead worker's last events just then (its id can appear between our "not found" and
    our create: a 409 conflict, after which the run is there to be set), so the whole step is tried
    again, at least ``min_attempts`` times and until ``timeout_s`` has passed. On a server recording
    another run's task runs at the same time, one attempt took seconds: a 15-s budget was spent by a
    "not found" and the conflict that followed it, and the shard stayed unmarked (seen here under
    load; tests/integration/test_reliability.py, the kill-always test's ``busy`` case).
    """
    import itertools
    import time

    deadline = time.monotonic() + timeout_s
    pause_s = 0.2
    for attempt in itertools.count(1):
        try:
            _set_or_create_crashed(task_run_id, message, task=task, name=name, flow_run_id=flow_run_id)
            return
        except Exception as exc:  # reporting must not hide the shard's own failure
            if attempt >= min_attempts and time.monotonic() + pause_s > deadline:
                log.warning("could not mark task run %s crashed: %s", task_run_id, exc)
                return
            log.debug("marking task run %s crashed, trying again: %s", task_run_id, exc)
            if not _conflict(exc):  # a conflict: recorded meanwhile, set it now
                time.sleep(pause_s)
                pause_s = min(2 * pause_s, 2.0)


def _set_or_create_crashed(task_run_id, message: str, *, task, name, flow_run_id) -> None:
    from prefect import get_client
    from prefect.states import Crashed

    with get_client(sync_client=True) as client:
        try:
            client.set_task_run_state(task_run_id, Crashed(message=message), force=True)
            if name is not None:
                response = client.request(
                    "PATCH", "/task_runs/{id}", path_params={"id": task_run_id}, json={"name": name}
                )
                response.raise_for_status()
        except Exception as exc:
            if not _not_found(exc) or task is None or flow_run_id is None:
                raise
            client.create_task_run(
                task=task,
                flow_run_id=flow_run_id,
                dynamic_key=str(task_run_id),
                id=task_run_id,
                name=name,
                state=Crashed(message=message),
            )


def _conflict(exc: Exception) -> bool:
    return getattr(getattr(exc, "response", None), "status_code", None) == 409


def _not_found(exc: Exception) -> bool:
    from prefect.exceptions import ObjectNotFound

    response = getattr(exc, "response", None)
    return isinstance(exc, ObjectNotFound) or getattr(response, "status_code", None) == 404


def mark_running_task_run_crashed(task_run_id, message: str) -> bool:
    """Set a task run the server holds as Running to Crashed (its worker was lost while running it; Dask
    runs it again elsewhere, under the same task run, which then goes on to Completed); True if it was
    changed. Also a run already Pending again for the rerun (it has a start time: it ran). A run the
    server holds in any other state (never started, already finished, or its worker's Running event
    lost with the worker) is left alone."""
    from prefect import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            try:
                run = client.read_task_run(task_run_id)
            except Exception as exc:
                if not _not_found(exc):
                    raise
                # not recorded yet (a batching recorder writes it within a second or so): there is no
                # Running run to correct; Dask's rerun records it, and a shard that fails for good is
                # marked by the flow (mark_task_run_crashed)
                log.debug("task run %s not recorded yet: not marked crashed", task_run_id)
                return False
            state = run.state
            if state is None or state.is_final() or not (state.is_running() or run.start_time is not None):
                return False
            client.set_task_run_state(task_run_id, Crashed(message=message), force=True)
            return True
    except Exception as exc:  # noqa: BLE001 - reporting; the shard's rerun goes on regardless
        log.warning("could not mark task run %s crashed: %s", task_run_id, exc)
        return False


def count_task_runs(post: Callable[[dict], int], flow_run_id=None) -> tuple[int, int]:
    """``(task runs, those in a terminal state)`` that the server holds of the flow run ``flow_run_id``
    (of every flow run when None): how far its task-run recorder has caught up, the one measure both
    :func:`wait_until_recorded` and a server's stop (:func:`espnet3_prefect.server.drain.drain`) read.

    ``post(body)`` sends ``body`` as one ``POST /task_runs/count`` to the server and returns the number
    it answers (each caller its own transport: a Prefect client, or plain HTTP to a server that is not
    the one configured). Terminal is Prefect's own set (``prefect.client.schemas.objects.TERMINAL_STATES``:
    a task run in one sends nothing more). The terminal ones are counted first: a run recorded between
    the two requests can only make the total larger, never the pair look caught up when it is not.
    """
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import TERMINAL_STATES

    of_run = (
        {}
        if flow_run_id is None
        else {
            "flow_runs": FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])).model_dump(
                mode="json", exclude_unset=True
            )
        }
    )
    terminal = TaskRunFilter(
        state=TaskRunFilterState(type=TaskRunFilterStateType(any_=sorted(TERMINAL_STATES)))
    ).model_dump(mode="json", exclude_unset=True)
    done = int(post({**of_run, "task_runs": terminal}))
    total = int(post(of_run))
    return total, done


def wait_until_recorded(
    flow_run_id,
    expected: int,
    *,
    timeout_s: float = 10.0,
    poll_s: float = 0.1,
    quiet: bool = False,
    stall_s: float | None = None,
) -> bool:
    """Wait until the server holds at least ``expected`` task runs of the flow run ``flow_run_id``, none
    of them in a state that is not final (:func:`count_task_runs`); True once it does, False after
    ``timeout_s`` (one warning line, unless ``quiet``), after ``stall_s`` (when given) in which no more
    of them became final (the rest are not coming: their events were lost), or when the server cannot
    be asked (the run's own result is never held up by this).

    A task run's states reach the server as events that its recorder writes asynchronously (batched:
    up to a second later on every server we start, :mod:`espnet3_prefect.server.services`; much later
    on a busy stock server, issue 39 measured 358 of 2,002 recorded when a run ended). A flow that
    finished before its shards were recorded showed, in the UI and to any client, a Completed run
    with shards missing; waiting here, before the flow's own final state is set, closes that gap.
    It asks at once (a run already recorded waits for nothing), then every ``poll_s``: the recorder
    writes once a second, so a coarser poll adds up to ``poll_s`` after the write it waits for.
    """
    import time

    from prefect import get_client

    if expected <= 0 or flow_run_id is None:
        return True
    deadline = time.monotonic() + timeout_s
    done = 0
    try:
        with get_client(sync_client=True) as client:

            def post(body: dict) -> int:
                return client.request("POST", "/task_runs/count", json=body).json()

            grew_at, last = time.monotonic(), -1
            while True:
                total, done = count_task_runs(post, flow_run_id)
                if done >= expected and total == done:
                    return True
                now = time.monotonic()
                if done != last:
                    grew_at, last = now, done
                if now + poll_s > deadline or (stall_s is not None and now - grew_at >= stall_s):
                    break
                time.sleep(poll_s)
    except Exception as exc:  # noqa: BLE001 - a report of the record, never the run's outcome
        log.debug("could not count the task runs of flow run %s: %s", flow_run_id, exc)
        return False
    if quiet:  # the caller has more to try
        return False
    log.warning(
        "the Prefect server had recorded %d of this flow run's %d task runs as finished %.0f s after its "
        "last one ended; the rest appear once its recorder catches up",
        done,
        expected,
        timeout_s,
    )
    return False


def mark_flow_run_crashed(flow_run_id, message: str) -> bool:
    """Set a flow run still Running (its process was killed) to Crashed; True if it was changed."""
    from prefect import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(flow_run_id)
            if run.state is None or not (run.state.is_running() or run.state.is_pending()):
                return False
            client.set_flow_run_state(flow_run_id, Crashed(message=message), force=True)
            return True
    except Exception as exc:
        log.warning("could not mark flow run %s crashed: %s", flow_run_id, exc)
        return False


def fails_with_its_message(fn):
    """Wrap a flow function: one of our errors (bad config, bad input: each one line) ends the flow run
    in a Failed state whose message is that line, logged once without a traceback, so
    ``prefect deployment run --watch``, ``prefect flow-run inspect`` and the UI's state show it. A caller
    in this process still gets the exception itself (the state carries it), so the command line's exit
    status and the drop-in's ``raise`` are unchanged. Other exceptions are left to Prefect."""
    import functools

    from espnet3_prefect.errors import Espnet3PrefectError, one_line

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from espnet3_prefect.execution.server_watch import deployment_watch

        try:
            with deployment_watch():  # a deployment's run outlives a server restart as a command's does
                return fn(*args, **kwargs)
        except Espnet3PrefectError as exc:
            from prefect import get_run_logger
            from prefect.states import Failed

            line = one_line(exc)
            _quiet_engine_traceback()
            get_run_logger().error("%s", line)
            _send_logs()  # before the Failed state: `--watch` stops at the state, and shows the line first
            return Failed(message=line, data=exc)

    return wrapper


def _send_logs() -> None:
    try:
        from prefect.logging.handlers import APILogHandler

        APILogHandler().flush()
    except Exception as exc:  # noqa: BLE001 - the state still says it
        log.debug("could not send the flow run's logs: %s", exc)


class _OwnErrorTraceback(logging.Filter):
    """Drops Prefect's flow-run log records that carry a traceback of one of our errors: a deployment
    run's engine logs "Engine execution exited with unexpected exception" with the whole traceback
    after the run has already failed with that error's one line as its state message (and its log)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from espnet3_prefect.errors import Espnet3PrefectError

        return not (record.exc_info and isinstance(record.exc_info[1], Espnet3PrefectError))


def _quiet_engine_traceback() -> None:
    engine = logging.getLogger("prefect.flow_runs")
    if not any(isinstance(f, _OwnErrorTraceback) for f in engine.filters):
        engine.addFilter(_OwnErrorTraceback())
