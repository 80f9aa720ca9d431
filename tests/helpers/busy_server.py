"""Keep a Prefect server busy recording another run: ``python -m tests.helpers.busy_server SECONDS N``
runs flows of N tiny task runs each against ``$PREFECT_API_URL`` until SECONDS have passed (bounded in
count and time, loopback only: the server a test started)."""

from __future__ import annotations

import sys
import time

from prefect import flow, task
from prefect.task_runners import ThreadPoolTaskRunner


@task
def tiny(i: int) -> int:
    return i


@flow(name="busy-neighbour", task_runner=ThreadPoolTaskRunner(max_workers=2))
def neighbour(n: int) -> int:
    return sum(f.result() for f in [tiny.submit(i) for i in range(n)])


if __name__ == "__main__":
    seconds, n = float(sys.argv[1]), int(sys.argv[2])
    deadline = time.monotonic() + seconds
    for _ in range(50):  # at most 50 flows, whatever the time
        if time.monotonic() > deadline:
            break
        neighbour(n)
