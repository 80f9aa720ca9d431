"""What "caught up" means, named once: :func:`espnet3_prefect.execution.run_states.count_task_runs` counts a flow
run's (or a whole server's) task runs and those in one of Prefect's terminal states, for both
:func:`~espnet3_prefect.execution.run_states.wait_until_recorded` and a server's stop
(:func:`espnet3_prefect.server.drain.task_run_counts`), on a real server; and the one read of Prefect's
private in-memory queues (:func:`espnet3_prefect.server.serve.queued_messages`) still finds them."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from espnet3_prefect.execution.run_states import count_task_runs, wait_until_recorded
from espnet3_prefect.server import drain, serve


def test_the_counts_ask_for_prefects_own_terminal_states():
    from prefect.client.schemas.objects import TERMINAL_STATES

    flow_run_id = uuid.uuid4()
    bodies: list[dict] = []
    assert count_task_runs(lambda body: bodies.append(body) or 7 - len(bodies), flow_run_id) == (5, 6)
    terminal, everything = bodies
    assert set(terminal["task_runs"]["state"]["type"]["any_"]) == {s.value for s in TERMINAL_STATES}
    assert terminal["flow_runs"] == everything["flow_runs"] == {"id": {"any_": [str(flow_run_id)]}}
    assert "task_runs" not in everything
    bodies.clear()
    count_task_runs(lambda body: bodies.append(body) or 0)  # the whole server: no flow-run filter
    assert [set(body) for body in bodies] == [{"task_runs"}, set()]


@pytest.fixture
def flow_run(prefect_server):
    """A flow run on the session's server with task runs Completed, Failed, Crashed, Cancelled (terminal)
    and Running, Pending (not); returns its id and a function that creates one more task run."""
    from prefect import flow, get_client, task
    from prefect.states import Cancelled, Completed, Crashed, Failed, Pending, Running

    @flow(name="e3p-caught-up")
    def counted():
        pass

    @task(name="e3p-caught-up-shard")
    def shard():
        pass

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(counted)

        def add(state):
            return client.create_task_run(task=shard, flow_run_id=run.id, dynamic_key=uuid.uuid4().hex, state=state)

        running = None
        for state in (Completed(), Failed(), Crashed(), Cancelled(), Running(), Pending()):
            created = add(state)
            running = created if state.is_running() else running
        yield run.id, client, running


def test_a_flow_runs_task_runs_are_counted_on_a_real_server(flow_run, prefect_server):
    from prefect.states import Completed

    flow_run_id, client, running = flow_run

    def post(body):
        return client.request("POST", "/task_runs/count", json=body).json()

    assert count_task_runs(post, flow_run_id) == (6, 4)
    assert count_task_runs(post, uuid.uuid4()) == (0, 0)
    # the stop's counts (plain HTTP to the server's URL) see the whole server, ours among them
    total, done = drain.task_run_counts(prefect_server)
    assert done >= 4 and total >= done + 2
    # the waiting side: 4 terminal of 6 is not caught up, whatever is expected
    assert wait_until_recorded(flow_run_id, 4, timeout_s=0.3, poll_s=0.05) is False
    client.set_task_run_state(running.id, Completed(), force=True)
    assert count_task_runs(post, flow_run_id) == (6, 5)
    assert wait_until_recorded(flow_run_id, 5, timeout_s=0.3, poll_s=0.05) is False  # one still Pending


def test_wait_until_recorded_is_true_once_every_task_run_is_terminal(prefect_server):
    from prefect import flow, get_client, task
    from prefect.states import Completed, Failed, Running

    @flow(name="e3p-caught-up-done")
    def counted():
        pass

    @task(name="e3p-caught-up-done-shard")
    def shard():
        pass

    with get_client(sync_client=True) as client:
        run = client.create_flow_run(counted)
        client.create_task_run(task=shard, flow_run_id=run.id, dynamic_key="a", state=Completed())
        last = client.create_task_run(task=shard, flow_run_id=run.id, dynamic_key="b", state=Running())
        assert wait_until_recorded(run.id, 2, timeout_s=0.3, poll_s=0.05) is False
        client.set_task_run_state(last.id, Failed(), force=True)
    assert wait_until_recorded(run.id, 2, timeout_s=5) is True
    assert wait_until_recorded(run.id, 3, timeout_s=0.3, poll_s=0.05) is False  # a third never comes


CHECKED = "checked against Prefect 3.9.1: serve.queued_messages() must be rewritten for this Prefect"


def test_prefects_in_memory_queues_are_still_where_serve_reads_them():
    """Fails loudly, naming what moved, when a Prefect upgrade changes what
    :func:`~espnet3_prefect.server.serve.queued_messages` reads (a stop would no longer drain)."""
    from prefect.server.utilities.messaging import memory

    assert isinstance(getattr(memory.Topic, "_topics", None), dict), f"memory.Topic._topics is gone ({CHECKED})"
    name = f"e3p-caught-up-{uuid.uuid4().hex}"
    topic = memory.Topic.by_name(name)
    try:
        assert memory.Topic._topics.get(name) is topic, f"Topic._topics no longer lists the topics ({CHECKED})"
        subscription = topic.subscribe()
        assert subscription in getattr(topic, "_subscriptions", ()), f"Topic._subscriptions is gone ({CHECKED})"
        for queue in ("_queue", "_retry"):
            assert callable(getattr(getattr(subscription, queue, None), "qsize", None)), (
                f"Subscription.{queue} is gone ({CHECKED})"
            )
        before = serve.queued_messages()
        assert before is not None, CHECKED

        async def publish_and_retry():
            await topic.publish(memory.MemoryMessage(data=b"0", attributes={}))
            await topic.publish(memory.MemoryMessage(data=b"1", attributes={}))
            assert serve.queued_messages() == before + 2
            message = await subscription.get()  # a service reads one, fails on it: it is put back
            assert serve.queued_messages() == before + 1
            await subscription.retry(message)
            assert serve.queued_messages() == before + 2  # the retried one is still to be read
            await subscription.get()
            await subscription.get()

        asyncio.run(publish_and_retry())
        assert serve.queued_messages() == before
    finally:
        topic.clear()
        memory.Topic._topics.pop(name, None)
