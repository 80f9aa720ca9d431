"""A cancel from the UI (or ``prefect flow-run cancel``) reaching a run that no Prefect worker holds.

Prefect acts on a cancel through the worker or runner that started a flow run: it kills that
process. A run started by ``espnet3-prefect run`` or ``python run.py`` has no such holder, and a
cancelled subflow run goes on under a parent that goes on (PrefectHQ/prefect#12713, #10339): the
server only records ``Cancelling``. :class:`CancelWatch` asks the server, every ``poll_s`` seconds,
for the state of the run it watches and of its subflow runs; the first in ``Cancelling`` or
``Cancelled`` sets :attr:`CancelWatch.event` (what a placed stage's wait checks) and calls
``on_cancel`` once (what stops a stage that runs in this process). An unreachable server is asked
again at the next poll: a watch never ends a run by itself. :func:`mark_cancelled` then ends the
run's children that did not finish in ``Cancelled``.
"""

from __future__ import annotations

import contextvars
import functools
import logging
import threading
from collections.abc import Callable
from typing import Any

from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.execution.abort import Abort

log = logging.getLogger("espnet3_prefect")

POLL_S = 2.0
CANCEL_TYPES = ("CANCELLING", "CANCELLED")


class CancelWatch:
    """Watch one flow run and its subflow runs for a cancel (a context manager: the thread lives inside)."""

    def __init__(self, flow_run_id: Any, *, on_cancel: Callable[[], None] | None = None, poll_s: float = POLL_S):
        self.flow_run_id, self.on_cancel, self.poll_s = flow_run_id, on_cancel, poll_s
        self.event = threading.Event()
        #: the name of the run whose cancel was seen
        self.by: str | None = None
        self._done = threading.Event()
        #: the watch's way to stop the run, once, never after its exit (:mod:`~espnet3_prefect.execution.abort`)
        self.abort = Abort(self._stop_the_run)
        # the thread asks the API this thread's Prefect settings name (a context, not the environment)
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._watch,), name="e3p-cancel-watch", daemon=True)

    def __enter__(self) -> CancelWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.abort.close()
        self._done.set()
        self._thread.join(self.poll_s + 35)  # a poll in flight ends within the client's timeout

    def _watch(self) -> None:
        from prefect import get_client

        with get_client(sync_client=True) as client:
            while not self._done.wait(self.poll_s):
                try:
                    found = cancelled_run(client, self.flow_run_id)
                except Exception as exc:  # the server is away: ask again at the next poll
                    log.debug("cancel watch: %r", exc)
                    continue
                if found is not None:
                    error = Espnet3PrefectError(f"the flow run {found!r} was cancelled")
                    self.abort.fire(error, functools.partial(self._saw, found))
                    return

    def _saw(self, found: str) -> None:
        self.by = found
        self.event.set()
        log.warning("the flow run %r was cancelled: stopping the recipe", found)

    def _stop_the_run(self) -> None:
        if self.on_cancel is not None:
            self.on_cancel()


def cancelled_run(client: Any, flow_run_id: Any) -> str | None:
    """The name of the run, or of one of its subflow runs, that is Cancelling or Cancelled; else None."""
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterParentFlowRunId,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )

    run = client.read_flow_run(flow_run_id)
    if run.state is not None and run.state.type.value in CANCEL_TYPES:
        return run.name
    children = client.read_flow_runs(
        flow_run_filter=FlowRunFilter(
            parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=list(CANCEL_TYPES))),
        ),
        limit=1,
    )
    return children[0].name if children else None


def mark_cancelled(flow_run_id: Any, message: str) -> int:
    """End the run's task runs and subflow runs that are not Completed (running, crashed, cancelling) in
    ``Cancelled``; returns how many. Best effort: a server that does not answer leaves them as they are."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterParentFlowRunId
    from prefect.states import Cancelled

    marked = 0
    try:
        with get_client(sync_client=True) as client:
            runs = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(parent_flow_run_id=FlowRunFilterParentFlowRunId(any_=[flow_run_id]))
            )
            tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
            for run in runs:
                if run.state is None or run.state.type.value not in ("COMPLETED", "CANCELLED", "FAILED"):
                    client.set_flow_run_state(run.id, Cancelled(message=message), force=True)
                    marked += 1
            for task in tasks:
                if task.state is None or task.state.type.value not in ("COMPLETED", "CANCELLED", "FAILED"):
                    client.set_task_run_state(task.id, Cancelled(message=message), force=True)
                    marked += 1
    except Exception as exc:
        log.warning("marking the cancelled run's children Cancelled failed: %s", exc)
    return marked


__all__ = ["CANCEL_TYPES", "CancelWatch", "cancelled_run", "mark_cancelled"]
