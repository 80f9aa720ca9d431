"""Before a server is stopped on purpose: let its task-run recorder catch up.

A ``prefect server start`` with Prefect's in-memory messaging holds the events clients sent but its
task-run recorder has not written yet in its own memory; a stop (even a graceful one) drops them,
and the UI then shows finished runs with shards missing, for good. :func:`drain` waits, bounded,
until the server's task runs stop changing (their number, and how many are in a terminal state) for a
few seconds: what a graceful stop of a kept or ``deploy-local`` server does first
(:func:`espnet3_prefect.server.registry.stop_servers`). A split server (:mod:`.split`) needs none:
its backlog waits in Redis.
"""

from __future__ import annotations

import base64
import json
import logging
import time
import urllib.request

log = logging.getLogger("espnet3_prefect")


def task_run_counts(
    api_url: str, *, cafile: str | None = None, auth_string: str | None = None, timeout_s: float = 10
) -> tuple[int, int]:
    """``(all task runs, those in a terminal state)`` of the server at ``api_url``
    (:func:`espnet3_prefect.execution.run_states.count_task_runs`, over plain HTTP: the server being
    stopped need not be the one this process's Prefect settings point to)."""
    from espnet3_prefect.execution.run_states import count_task_runs
    from espnet3_prefect.server.https import client_context

    context = client_context(cafile) if api_url.startswith("https://") else None

    def post(body: dict) -> int:
        request = urllib.request.Request(
            f"{api_url}/task_runs/count",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        if auth_string:
            request.add_header("Authorization", "Basic " + base64.b64encode(auth_string.encode()).decode())
        with urllib.request.urlopen(request, timeout=timeout_s, context=context) as resp:
            return int(json.load(resp))

    return count_task_runs(post)


def drain(
    api_url: str,
    *,
    cafile: str | None = None,
    auth_string: str | None = None,
    quiet_s: float = 2.0,
    limit_s: float = 60.0,
) -> bool:
    """Wait until the task-run counts of :func:`task_run_counts` have not changed for ``quiet_s``
    (the recorder writes at least every second when it has something); at most ``limit_s``. True
    when they settled, False when the limit came first or the server did not answer (then the
    caller stops it anyway: a drain never keeps a stop from happening)."""
    deadline = time.monotonic() + limit_s
    last, since = None, time.monotonic()
    while time.monotonic() < deadline:
        try:
            now = task_run_counts(api_url, cafile=cafile, auth_string=auth_string)
        except (OSError, ValueError):
            return False
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return True
        time.sleep(0.5)
    log.warning(
        "the Prefect server at %s was still recording task runs after %g s; stopping it anyway", api_url, limit_s
    )
    return False


def drain_server(home: str, api_url: str, cafile: str | None = None, limit_s: float = 60.0) -> bool:
    """:func:`drain` for the server whose state dir is ``home`` (its client file's credential when it
    asks for one). Never raises: a server that cannot be asked is stopped as it is."""
    from espnet3_prefect.disk.client_file import client_file, read_client_file
    from espnet3_prefect.errors import Espnet3PrefectError

    auth_string = None
    if client_file(home).exists():
        try:
            creds = read_client_file(client_file(home))
        except Espnet3PrefectError:
            creds = None
        if creds is not None and creds.api_url == api_url:
            auth_string, cafile = creds.auth_string, cafile or creds.ssl_cert_file
    return drain(api_url, cafile=cafile, auth_string=auth_string, limit_s=limit_s)
