"""The lost-worker watch makes the API writes about dead workers' shards in its own thread: booking a shard
that Dask gave up on (``KilledWorker``) returns its line at once, however slow the API, and the mark is
still made, in the flow run's context, before the watch's ``with`` block ends."""

from __future__ import annotations

import contextvars
import logging
import threading
import time
import uuid
from types import SimpleNamespace

import pytest
from distributed.scheduler import KilledWorker

from espnet3_prefect.execution import worker_watch
from espnet3_prefect.execution.worker_watch import LostWorkers
from espnet3_prefect.flows.dispatch import _book, shard_where
from espnet3_prefect.pipeline.plan import Shard
from espnet3_prefect.pipeline.report import empty_timing
from espnet3_prefect.pipeline.summary import ShardOutcome

LOG = logging.getLogger("espnet3_prefect.test")
RUN = contextvars.ContextVar("run", default=None)  # stands for the flow run's context


class Client:
    """What the watch and the booking use of a Dask client."""

    def __init__(self):
        self.topics: dict = {}
        self.cancelled: list = []

    def subscribe_topic(self, topic, handler):
        self.topics[topic] = handler

    def unsubscribe_topic(self, topic):
        self.topics.pop(topic)

    def cancel(self, futures):
        self.cancelled += futures


class Future:
    """A Prefect future over a Dask one: a finished shard whose ``result()`` raises ``exc``."""

    def __init__(self, key: str, exc: Exception | None = None, done: bool = False):
        self.task_run_id = uuid.uuid4()
        self.wrapped_future = SimpleNamespace(key=key, done=lambda: done)
        self._exc = exc

    def result(self):
        raise self._exc


class SlowApi:
    """``mark_task_run_crashed`` on an API that answers only once the test lets it (10 s at most)."""

    def __init__(self):
        self.released = threading.Event()
        self.marks: list[dict] = []

    def __call__(self, task_run_id, message, **kwargs):
        answered = self.released.wait(10)
        self.marks.append(
            dict(
                task_run_id=task_run_id,
                message=message,
                answered=answered,
                thread=threading.current_thread().name,
                run=RUN.get(),
                **kwargs,
            )
        )


def book_killed(lost: LostWorkers, client: Client, pending: dict, key: str) -> list[str]:
    return _book(SimpleNamespace(client=client), SimpleNamespace(key=key), pending, ShardOutcome(timing=empty_timing()),
                 None, "test set 't'", lost)  # fmt: skip


def test_booking_a_killed_shard_returns_its_line_without_waiting_for_the_api(monkeypatch):
    api = SlowApi()
    monkeypatch.setattr(worker_watch, "mark_task_run_crashed", api)
    client, shard = Client(), Shard("t", 3, 15, 20)
    future = Future("run-shard-3", KilledWorker("run-shard-3", "tcp://w", 2))
    pending = {"run-shard-3": (future, shard)}
    RUN.set("flow run 1")
    with LostWorkers(client, pending, log=LOG, where=shard_where) as lost:
        lines = book_killed(lost, client, pending, "run-shard-3")
        # booked while the API has not answered: the mark waits in the watch's thread
        assert lines == ["split.3 items [15, 20): its worker died while running it (KilledWorker); not retried further"]
        assert api.marks == [] and pending == {}
        api.released.set()
    # ...and is made before the block ends, in the context of the thread that entered it
    [mark] = api.marks
    assert mark["answered"] and mark["thread"] == "e3p-lost-workers" and mark["run"] == "flow run 1"
    assert (mark["task_run_id"], mark["message"]) == (future.task_run_id, lines[0])
    assert mark["name"] == "run-shard-t-3" and mark["task"].name == "run-shard"
    assert 0 < mark["timeout_s"] <= LostWorkers.MARK_S
    assert client.topics == {} and client.cancelled == []


def test_the_exit_waits_for_a_crash_mark_past_its_join_time_but_not_past_the_marks_budget(monkeypatch):
    api = SlowApi()
    monkeypatch.setattr(worker_watch, "mark_task_run_crashed", api)
    monkeypatch.setattr(LostWorkers, "JOIN_S", 0.0)
    # within its budget: the exit waits for the mark
    with LostWorkers(Client(), {}, log=LOG, where=shard_where) as lost:
        lost.crashed(uuid.uuid4(), "its worker died")
        threading.Timer(0.5, api.released.set).start()
    assert [m["answered"] for m in api.marks] == [True]
    # an API that does not answer within the mark's budget does not hold the exit longer than that
    api.released.clear()
    monkeypatch.setattr(LostWorkers, "MARK_S", 0.5)
    started = time.monotonic()
    with LostWorkers(Client(), {}, log=LOG, where=shard_where) as lost:
        lost.crashed(uuid.uuid4(), "its worker died")
    assert time.monotonic() - started < 5.0
    api.released.set()  # the daemon thread ends


@pytest.mark.parametrize("done", [False, True])
def test_a_worker_removed_while_running_a_shard_marks_its_task_run_crashed(monkeypatch, caplog, done):
    marked = []
    monkeypatch.setattr(worker_watch, "mark_running_task_run_crashed", lambda *a: marked.append(a) or True)
    client, shard = Client(), Shard("t", 1, 5, 10)
    future, queued = Future("run-shard-1", done=done), Future("run-shard-2")
    pending = {"run-shard-1": (future, shard), "run-shard-2": (queued, Shard("t", 2, 10, 15))}
    with caplog.at_level(logging.WARNING, logger=LOG.name):
        with LostWorkers(client, pending, log=LOG, where=shard_where):
            event = {"action": "remove-worker", "worker": "tcp://w1", "processing-tasks": ["run-shard-1", "other"]}
            client.topics["all"]((time.time(), event))
    message = "split.1 items [5, 10): its worker tcp://w1 was lost while running it; the shard runs again elsewhere"
    # a shard whose result is in already is left alone, and so is one merely queued on the worker
    assert marked == ([] if done else [(future.task_run_id, message)])
    assert [r.getMessage() for r in caplog.records] == ([] if done else [message])
