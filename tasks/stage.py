"""Tasks ``stage`` and ``cached-stage``: one of ESPnet3's own stages as a task run of the recipe's flow
run (named after the stage: ``create_dataset``, ``train``, ...), and a done stage shown as Cached.

While a stage runs, what ESPnet3, ESPnet2 and Lightning log (the ``[START]``/``[DONE]`` lines, the
training progress) also goes to the Prefect run that is current where it is logged (the stage's task
run, or the ``infer`` flow run inside the stage), under the logger's own name, and nowhere else (the
terminal and ``<stage>.log`` already have it), at most :data:`LINES_PER_S` lines a second on
average with bursts of :data:`BURST_LINES`: the UI keeps up with a chatty trainer, the stage's
``<stage>.log`` keeps every line, and the run says how many lines it left to that file.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.states import Cancelled, Completed

#: the average rate, and the burst, of log lines a stage sends to the Prefect API
LINES_PER_S = 20.0
BURST_LINES = 200
#: loggers whose lines are Prefect's own, or its HTTP client's (sending a line logs a request)
NOT_FORWARDED = ("prefect", "httpx", "httpcore", "uvicorn", "asyncio", "websockets")


class StageLogs(logging.Handler):
    """Hands log records of the stage's code to Prefect's API log handler (token bucket): each record
    goes to the run current where it was logged, or, from a thread outside any run, to the stage's."""

    def __init__(self):
        super().__init__(logging.INFO)
        from prefect.logging.handlers import APILogHandler

        self.api, self.ids = APILogHandler(), _current_ids()
        self.tokens, self.dropped, self.last = float(BURST_LINES), 0, time.monotonic()

    def allow(self) -> bool:
        """Whether a line may go now (called under the handler's own lock, as ``emit`` is)."""
        now = time.monotonic()
        self.tokens = min(BURST_LINES, self.tokens + (now - self.last) * LINES_PER_S)
        self.last = now
        if self.tokens >= 1:
            self.tokens -= 1
            return True
        self.dropped += 1
        return False

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.startswith(NOT_FORWARDED) or not self.allow():
            return
        copy = logging.makeLogRecord(record.__dict__)
        if _current_ids() == (None, None):
            copy.flow_run_id, copy.task_run_id = self.ids
        self.api.handle(copy)


def _current_ids() -> tuple:
    """``(flow run id, task run id)`` of the run current in this thread, ``(None, None)`` outside one."""
    from prefect.context import FlowRunContext, TaskRunContext

    task_run = getattr(TaskRunContext.get(), "task_run", None)
    if task_run is not None:
        return task_run.flow_run_id, task_run.id
    flow_run = getattr(FlowRunContext.get(), "flow_run", None)
    return (flow_run.id, None) if flow_run is not None else (None, None)


@contextlib.contextmanager
def stage_logs_to_prefect(stage: str) -> Iterator[StageLogs]:
    """While the block runs, log records of the process (not Prefect's own) reach the current run's log."""
    handler = StageLogs()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        if handler.dropped:
            get_run_logger().info(
                "%s: %d log lines past %g lines/s are in its <stage>.log only", stage, handler.dropped, LINES_PER_S
            )


@task(name="stage", cache_policy=NO_CACHE, retries=0)
def run_stage(stage: str, call: Callable[[], None]):
    """Run one of ESPnet3's stages (``call``: its own ``run_stages`` for that stage) with its logs in the
    UI; a placed stage whose job was cancelled ends Cancelled."""
    from espnet3_prefect.execution.stage_job import JobCancelled

    with stage_logs_to_prefect(stage):
        try:
            call()
        except JobCancelled as exc:
            return Cancelled(message=str(exc))
    return None


@task(name="cached-stage", cache_policy=NO_CACHE, retries=0)
def cached_stage(stage: str, reason: str):
    """A done stage: the task run ends Cached, its message the reason (inputs unchanged, outputs intact)."""
    get_run_logger().info("%s: Cached (%s)", stage, reason)
    return Completed(name="Cached", message=reason)


__all__ = ["BURST_LINES", "LINES_PER_S", "StageLogs", "cached_stage", "run_stage", "stage_logs_to_prefect"]
