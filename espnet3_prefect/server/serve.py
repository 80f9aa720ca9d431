"""``python -m espnet3_prefect.server.serve --host H --port P [--ssl-certfile C --ssl-keyfile K]``: Prefect's
server (API, UI and its services) in uvicorn, over HTTPS with a certificate and key, and with a
graceful stop that first lets the services write what they hold.

``prefect server start`` runs the same app (the final app with its background services) in the
foreground, but has no TLS options, and its stop drops what its services had not yet written: Prefect
passes a run's events to the task-run recorder and the event persister through in-memory queues,
and on SIGTERM the services are stopped with their queues unread. Of 1,000 task runs whose flow
returned just before a stop, a SQLite server recorded 685 with Prefect's defaults, 913 with our
batching, 1,000 with batching and this drain; a PostgreSQL one 0, 579 and 1,000 (at a load of 15-30
on 2 cores; ``python -m benchmarks.recorder_backlog``, docs/lab-server.md). Here the stop waits, once
uvicorn has stopped taking requests and before the services stop, until those queues are empty
(:func:`drain`), at most ``$ESPNET3_PREFECT_DRAIN_TIMEOUT_S`` seconds (default
:data:`DRAIN_TIMEOUT_S`; 0: no wait), and less
when nothing is read from them for :data:`STALLED_S`. With Redis messaging (``prefect-redis``) the
queues outlive the server and nothing is waited for.

Settings come from the environment as for ``prefect server start`` (``PREFECT_SERVER_*``, the auth
string and the database URL included); started by :func:`espnet3_prefect.server.process.start_server`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time

from espnet3_prefect._internal.stopping import SERVER_STOP

#: the longest a stop waits for the services' queues (below what a guard and a stop wait before SIGKILL:
#: :data:`~espnet3_prefect._internal.stopping.SERVER_STOP` keeps them in order): under a load of ~30
#: on 2 cores a SQLite server wrote 1,000 task runs' events in 8.6 s, and 6 s lost 303 of them
DRAIN_TIMEOUT_S = SERVER_STOP.drain_s
#: a queue not read from for this long has no service reading it: the stop waits no more
STALLED_S = 2.0
DRAIN_VAR = "ESPNET3_PREFECT_DRAIN_TIMEOUT_S"
#: Prefect's in-memory messaging (its default broker): the queues :func:`drain` waits for
MEMORY_BROKER = "prefect.server.utilities.messaging.memory"


def queued_messages() -> int | None:
    """Messages delivered to the in-memory subscriptions (the services' inboxes) and not yet read,
    those put back to be tried again included; None when this Prefect does not keep them where we
    look (then nothing is waited for).

    The one place that reads Prefect's private attributes (``Topic._topics``, a topic's
    ``_subscriptions``, a subscription's ``_queue`` and ``_retry``), checked against Prefect 3.9.1's
    ``prefect/server/utilities/messaging/memory.py``: it has no public way to ask. A ``Subscription``
    offers only ``get()``, a ``Topic`` neither its list of topics nor its queues' sizes. The module's
    ``METRICS`` (per topic: published, consumed; for the recorder's debug log) is public by name, but
    counts since the process started: a message sent to the dead-letter queue, or left in the queue of
    a consumer that went away (a UI's event stream closing), stays published and never consumed, so a
    stop would wait :data:`STALLED_S` every time and report messages that are gone. Counting what the
    recorder wrote through the API instead (what :mod:`.drain` does from outside) cannot tell "caught
    up" from "nothing more came" without waiting for a quiet spell. tests/unit/test_caught_up.py fails
    when a Prefect upgrade moves these attributes."""
    from prefect.server.utilities.messaging import memory

    try:
        topics = list(memory.Topic._topics.values())
        return sum(sub._queue.qsize() + sub._retry.qsize() for topic in topics for sub in topic._subscriptions)
    except (AttributeError, TypeError):
        return None


async def drain(timeout_s: float, poll_s: float = 0.1) -> tuple[int | None, float]:
    """Wait until the services have read every queued message (or ``timeout_s``, or no progress for
    :data:`STALLED_S`); then the services' own stop writes what they read. Returns (messages left,
    seconds waited)."""
    started = time.monotonic()
    left = queued_messages()
    last, last_change = left, started
    while left and time.monotonic() - started < timeout_s:
        await asyncio.sleep(poll_s)
        left = queued_messages()
        if left != last:
            last, last_change = left, time.monotonic()
        elif time.monotonic() - last_change >= STALLED_S:
            break
    if left == 0:
        await asyncio.sleep(poll_s)  # the last messages read are handed to the services' batches
    return left, time.monotonic() - started


def drain_timeout_s(environ: dict[str, str] | None = None) -> float:
    """``$ESPNET3_PREFECT_DRAIN_TIMEOUT_S`` (seconds, >= 0), else :data:`DRAIN_TIMEOUT_S`.

    >>> drain_timeout_s({}), drain_timeout_s({"ESPNET3_PREFECT_DRAIN_TIMEOUT_S": "0"})
    (20.0, 0.0)
    """
    from espnet3_prefect.errors import ConfigError

    raw = (os.environ if environ is None else environ).get(DRAIN_VAR)
    if raw is None:
        return DRAIN_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if value < 0:
        raise ConfigError(f"{DRAIN_VAR}: {raw!r} is not a number of seconds >= 0")
    return value


def with_drain(app, timeout_s: float) -> None:
    """Wrap ``app``'s lifespan: on shutdown, :func:`drain` before Prefect stops its services."""
    from prefect.settings import get_current_settings

    if timeout_s <= 0 or get_current_settings().server.events.messaging_broker != MEMORY_BROKER:
        return
    inner = app.router.lifespan_context

    @contextlib.asynccontextmanager
    async def draining(app_):
        async with inner(app_) as state:
            yield state
            left, waited_s = await drain(timeout_s)
            line = (
                "espnet3-prefect: stopping; this Prefect's service queues are not where we look: not drained"
                if left is None
                else f"espnet3-prefect: stopping; services' queues: {left} messages left after {waited_s:.1f} s"
            )
            print(line, flush=True)

    app.router.lifespan_context = draining


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m espnet3_prefect.server.serve", description=__doc__)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ssl-certfile", default=None)
    parser.add_argument("--ssl-keyfile", default=None)
    args = parser.parse_args(argv)
    if (args.ssl_certfile is None) != (args.ssl_keyfile is None):
        parser.error("--ssl-certfile and --ssl-keyfile go together")
    timeout_s = drain_timeout_s()

    import uvicorn
    from prefect.server.api.server import create_app
    from prefect.settings import get_current_settings

    server = get_current_settings().server
    scheme = "HTTPS" if args.ssl_certfile else "HTTP"
    print(
        f"espnet3-prefect: Prefect server (API, UI, services) over {scheme} on {args.host}:{args.port}"
        + (f", certificate {args.ssl_certfile}" if args.ssl_certfile else ""),
        flush=True,
    )
    app = create_app(final=True)
    with_drain(app, timeout_s)
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        timeout_keep_alive=server.api.keepalive_timeout,
        ws_ping_interval=server.api.websocket_ping_interval,
        ws_ping_timeout=server.api.websocket_ping_timeout,
        log_level=str(server.logging_level).lower(),
    )


if __name__ == "__main__":
    main()
