"""Which Prefect server services the embedded server runs, and how they write what a run sends.

A run sends, per task run, three state events (Pending, Running, Completed) and a few log lines.
Prefect's task-run recorder writes each state event in a database transaction of its own by
default, and the event persister reads one event at a time: on the same 2 cores as the workers
that was ~20 ms of server CPU per task run. Every server we start (a CLI run's own, ``--keep-server``,
``deploy-local``'s, on SQLite or PostgreSQL) has both take up to 50 events and write them at least
every second (:data:`BATCHED`): ~8 ms per task run (``python -m benchmarks.run``, group
``overhead``); the UI shows every task run, state and event at most a second later, where with
Prefect's defaults a server fell minutes behind a busy run and lost the backlog when it stopped
(``python -m benchmarks.recorder_backlog``). A CLI run's own server (``services="run"``) also goes
without :data:`RUN_ONLY_OFF`. Long-running servers (``services="all"``) keep events and finished
runs for :data:`RETENTION` (Prefect's vacuum service). A variable the user set in the environment
wins over ours.
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
#: how long a long-running server keeps what runs leave behind, set with Prefect's own settings:
#: events 7 days (Prefect's default, named so that it is ours to change), flow runs (with their task
#: runs, logs and artifacts) 90 days after they ended, vacuumed hourly (Prefect deletes none by default)
RETENTION = {
    "PREFECT_SERVER_EVENTS_RETENTION_PERIOD": "P7D",
    "PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED": "events,flow_runs",
    "PREFECT_SERVER_SERVICES_DB_VACUUM_RETENTION_PERIOD": str(90 * 24 * 3600),
}


def service_environ(services: str, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables to add to the server's environment for ``services`` (``"all"``, ``"run"``, or
    ``"none"``: an API process whose services run in a process of their own, :mod:`.split`); none
    that ``environ`` (the user's) already sets.

    >>> env = service_environ("run", {"PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED": "true"})
    >>> "PREFECT_SERVER_SERVICES_SCHEDULER_ENABLED" in env, env["PREFECT_SERVER_SERVICES_FOREMAN_ENABLED"]
    (False, 'false')
    >>> [service_environ(s, {})["PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE"] for s in SERVICES]
    ['50', '50', '50']
    >>> "PREFECT_SERVER_SERVICES_DB_VACUUM_ENABLED" in service_environ("all", {})
    True
    """
    if services not in SERVICES:
        raise ValueError(f"services: {services!r} is not one of {', '.join(SERVICES)}")
    wanted = dict(BATCHED)
    if services == "run":
        wanted.update({f"{_PREFIX}{name}_ENABLED": "false" for name in RUN_ONLY_OFF})
    else:
        wanted.update(RETENTION)
    return {name: value for name, value in wanted.items() if name not in environ}
