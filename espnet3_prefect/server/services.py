"""Which Prefect server services the embedded server runs, and how they write what a run sends.

A run sends, per task run, three state events (Pending, Running, Completed) and a few log lines.
Prefect's task-run recorder writes each state event in a database transaction of its own by
default, and the event persister reads one event at a time: on the same 2 cores as the workers
that was ~20 ms of server CPU per task run. A CLI run's own server (``services="run"``) has both take
up to 50 events and write them at least every second (:data:`BATCHED`): ~8 ms per task run
(``python -m benchmarks.run``, group ``overhead``); the UI shows every task run, state and event, at
most a second later, and the server writes what it holds when it stops at the end of the run. It
also goes without :data:`RUN_ONLY_OFF`. A server that outlives the run (``--keep-server``,
``deploy-local``), which other programs may read right after a run, keeps Prefect's defaults. A
variable the user set in the environment wins over ours.
"""

from __future__ import annotations

from collections.abc import Mapping

_PREFIX = "PREFECT_SERVER_SERVICES_"
#: what a run's own server goes without: deployment schedules, late and paused runs, work-pool
#: workers' health, cancelled runs' children, concurrency leases. Task runs, events, logs, artifacts
#: (task-run recorder, event persister) and automations (triggers) stay.
RUN_ONLY_OFF = ("SCHEDULER", "LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS", "CANCELLATION_CLEANUP", "REPOSSESSOR")
#: events written in batches of up to 50, at least every second
BATCHED = {
    f"{_PREFIX}{service}_{key}": value
    for service in ("TASK_RUN_RECORDER", "EVENT_PERSISTER")
    for key, value in (("READ_BATCH_SIZE", "50"), ("BATCH_SIZE", "50"), ("FLUSH_INTERVAL", "1"))
}
SERVICES = ("all", "run", "none")


def service_environ(services: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to the server's environment for ``services`` (``"all"``, ``"run"``, or
    ``"none"``: an API process whose services run in a process of their own, :mod:`.split`); none
    that ``environ`` (the user's) already sets.

    >>> env = service_environ("run", {"PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "true"})
    >>> "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED" in env, env["PREFECT_SERVER_SERVICES_FOREMAN_ENABLED"]
    (False, 'false')
    >>> service_environ("run", {})["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE"], service_environ("all", {})
    ('50', {})
    """
    if services not in SERVICES:
        raise ValueError(f"services: {services!r} is not one of {', '.join(SERVICES)}")
    wanted = {}
    if services == "run":
        wanted.update(BATCHED)
        wanted.update({f"{_PREFIX}{name}_ENABLED": "false" for name in RUN_ONLY_OFF})
    return {name: value for name, value in wanted.items() if name not in environ}
