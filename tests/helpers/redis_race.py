"""Two events through Prefect's server-side event publisher, one connection's way (each ``publish``
awaited before the next is read), with the publisher's Redis duplicate check held open once it has
run: the window of any flush that awaits Redis. The second event is handed over while a flush is
in that window, if one can be (a background flush can; a flush the sender itself awaits cannot).
Prints how many of the two are in Redis's streams after the publisher closed.
Run in a fresh interpreter, so Prefect reads the publisher's settings from this environment.

    python -m tests.helpers.redis_race
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from tests.helpers.redis_pump import landed


async def race() -> int:
    import prefect_redis.messaging as messaging
    from prefect.server.events.messaging import create_event_publisher
    from prefect.server.events.schemas.events import Event

    entered, released = asyncio.Event(), asyncio.Event()
    checked = messaging.Cache.without_duplicates

    async def held(self, attribute, messages):
        kept = await checked(self, attribute, messages)  # the round trip to Redis is done ...
        entered.set()
        await released.wait()  # ... and its answer is still on its way back
        return kept

    messaging.Cache.without_duplicates = held
    second = asyncio.Event()

    def event(i: int):
        return Event(
            occurred=datetime.now(UTC),
            event="e3p.race",
            resource={"prefect.resource.id": f"e3p.race.{i}"},
            id=uuid.uuid4(),
        ).receive()

    async with create_event_publisher() as publisher:

        async def connection() -> None:  # the API's /events/in loop: one event at a time
            await publisher.publish_event(event(0))
            await second.wait()
            await publisher.publish_event(event(1))

        sender = asyncio.create_task(connection())
        await asyncio.wait_for(entered.wait(), timeout=15)  # a flush is in its window
        second.set()
        await asyncio.sleep(0.2)  # the second event goes in now, if the sender is free to send it
        released.set()
        await asyncio.wait_for(sender, timeout=15)
        await asyncio.sleep(0.5)  # a flush still in flight ends before the publisher's own last one
    return landed()


if __name__ == "__main__":
    print(asyncio.run(race()))
