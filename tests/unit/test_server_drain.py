"""The draining stop of :mod:`espnet3_prefect.server.serve`, on Prefect's real in-memory messaging: it
sees what the services have not read, waits while they read it, and gives up on a queue nobody reads.
If Prefect moves its queues, :func:`queued_messages` answers None and the first test fails: the
stop would no longer drain (docs/lab-server.md)."""

from __future__ import annotations

import asyncio

import pytest

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.server import serve


@pytest.fixture
def topic():
    from prefect.server.utilities.messaging.memory import Topic

    name = "e3p-drain-test"
    yield Topic.by_name(name)
    Topic.by_name(name).clear()


async def _publish(topic, n: int) -> None:
    from prefect.server.utilities.messaging.memory import MemoryMessage

    for i in range(n):
        await topic.publish(MemoryMessage(data=str(i).encode(), attributes={}))


def test_queued_messages_counts_what_no_service_has_read(topic):
    subscription = topic.subscribe()
    before = serve.queued_messages()
    assert before is not None
    asyncio.run(_publish(topic, 5))
    assert serve.queued_messages() == before + 5
    topic.unsubscribe(subscription)
    assert serve.queued_messages() == before


def test_drain_waits_while_a_reader_empties_the_queue(topic):
    subscription = topic.subscribe()

    async def scenario():
        await _publish(topic, 40)

        async def reader():
            for _ in range(40):
                await subscription.get()
                await asyncio.sleep(0.02)  # a service writing as it reads

        task = asyncio.create_task(reader())
        left, waited_s = await serve.drain(timeout_s=30, poll_s=0.05)
        await task
        return left

    assert asyncio.run(scenario()) == 0


def test_drain_gives_up_on_a_queue_nobody_reads(topic, monkeypatch):
    topic.subscribe()
    monkeypatch.setattr(serve, "STALLED_S", 0.3)
    asyncio.run(_publish(topic, 3))
    left, waited_s = asyncio.run(serve.drain(timeout_s=30, poll_s=0.05))
    assert left >= 3 and waited_s < 30


def test_drain_timeout_is_checked_before_the_server_starts():
    with pytest.raises(ConfigError, match="ESPNET3_PREFECT_DRAIN_TIMEOUT_S: 'soon' is not a number"):
        serve.drain_timeout_s({"ESPNET3_PREFECT_DRAIN_TIMEOUT_S": "soon"})
    with pytest.raises(ConfigError):
        serve.drain_timeout_s({"ESPNET3_PREFECT_DRAIN_TIMEOUT_S": "-1"})
