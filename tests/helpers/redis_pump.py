"""Publish N events through Prefect's own server-side event publisher (as the API's ``/events/in``
websocket does for a connected client: one message at a time), keep the publisher open as a client's
connection stays open, and print how many are in Redis's streams by then, then after it closed.
Run in a fresh interpreter, so Prefect reads its settings (the publisher's batch size and
background flush interval among them) from this environment.

    python -m tests.helpers.redis_pump N HOLD_S
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid
from datetime import UTC, datetime


async def pump(n: int, hold_s: float) -> tuple[int, int]:
    from prefect.server.events.messaging import create_event_publisher
    from prefect.server.events.schemas.events import Event

    async with create_event_publisher() as publisher:
        for i in range(n):
            event = Event(
                occurred=datetime.now(UTC),
                event="e3p.pump",
                resource={"prefect.resource.id": f"e3p.pump.{i}"},
                id=uuid.uuid4(),
            )
            await publisher.publish_event(event.receive())
        await asyncio.sleep(hold_s)  # the client is still connected, sending nothing
        while_open = landed()
    return while_open, landed()


def landed() -> int:
    """Messages in the Redis streams (what the server's recorder and event persister can read)."""
    import redis

    client = redis.Redis(
        host=os.environ["PREFECT_REDIS_MESSAGING_HOST"],
        port=int(os.environ["PREFECT_REDIS_MESSAGING_PORT"]),
        password=os.environ["PREFECT_REDIS_MESSAGING_PASSWORD"],
        db=int(os.environ.get("PREFECT_REDIS_MESSAGING_DB", "0")),
    )
    return sum(client.xlen(key) for key in client.scan_iter() if client.type(key) == b"stream")


if __name__ == "__main__":
    print(*asyncio.run(pump(int(sys.argv[1]), float(sys.argv[2]))))
