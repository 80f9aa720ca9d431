"""A flow run's run lock: :func:`take_run_lock` takes a folder's lock (:mod:`espnet3_prefect.pipeline.lock`)
for the running flow run, and marks the flow run of a killed earlier holder Crashed in the API, with
the shards it finished and never reported recorded in it (:mod:`espnet3_prefect.execution.catch_up`)."""

from __future__ import annotations

from pathlib import Path

from espnet3_prefect.execution.run_states import mark_flow_run_crashed
from espnet3_prefect.pipeline.lock import RunLock, acquire


def take_run_lock(folder: Path, logger) -> RunLock:
    """Take ``folder``'s run lock; a killed earlier run's flow run is marked Crashed."""
    from prefect.runtime import flow_run

    lock = acquire(folder, str(flow_run.id) if flow_run.id else None)
    stale = lock.stale_holder
    if stale:
        logger.warning("took over the lock of a run that is gone (pid %s on %s)", stale.get("pid"), stale.get("host"))
        if stale.get("flow_run_id") and mark_flow_run_crashed(
            stale["flow_run_id"], f"its process (pid {stale.get('pid')} on {stale.get('host')}) is gone"
        ):
            logger.warning("marked the stale flow run %s as Crashed", stale["flow_run_id"])
        if stale.get("flow_run_id"):
            from espnet3_prefect.execution.catch_up import record_killed_run

            # what it finished while its server was unreachable: recorded as its own, from the markers
            sent = record_killed_run(folder, stale["flow_run_id"])
            if sent:
                logger.warning("recorded %d shard(s) the stale flow run finished but never reported", sent)
    return lock
