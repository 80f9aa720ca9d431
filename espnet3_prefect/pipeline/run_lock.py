"""A flow run's run lock: :func:`take_run_lock` takes a folder's lock (:mod:`espnet3_prefect.pipeline.lock`)
for the running flow run, and marks the flow run of an earlier holder that could not end its own record
Crashed in the API, with the shards it finished and never reported recorded in it
(:mod:`espnet3_prefect.execution.catch_up`): a holder that was killed (its lock left behind), or one
that ended because its Prefect server stayed away (:func:`release_run_lock` leaves a note for it, so
that a re-run that finds every shard done still starts and writes that record)."""

from __future__ import annotations

import json
from pathlib import Path

from espnet3_prefect._internal.atomic import atomic_write_text
from espnet3_prefect.disk.layout import UNREPORTED_NAME
from espnet3_prefect.execution.run_states import mark_flow_run_crashed
from espnet3_prefect.pipeline.lock import RunLock, acquire


def take_run_lock(folder: Path, logger) -> RunLock:
    """Take ``folder``'s run lock; a killed earlier run's flow run is marked Crashed, as is one that
    ended without its server, and their unreported shards are recorded in them."""
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
    _record_unreported(Path(folder), logger)
    return lock


def _record_unreported(folder: Path, logger) -> None:
    note_path = folder / UNREPORTED_NAME
    try:
        note = json.loads(note_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return
    flow_run_id = note.get("flow_run_id")
    if flow_run_id:
        from espnet3_prefect.execution.catch_up import record_killed_run

        mark_flow_run_crashed(flow_run_id, f"it ended without its Prefect server: {note.get('reason')}")
        sent = record_killed_run(folder, flow_run_id)
        logger.warning(
            "the run %s ended without its Prefect server; recorded %d shard(s) it finished", flow_run_id, sent
        )
    note_path.unlink(missing_ok=True)


def release_run_lock(lock: RunLock, folder: Path) -> None:
    """Release the lock; when the run ends because its Prefect server stayed away (the watch's line),
    first leave a note beside it, so the next run records what this one could not (:func:`take_run_lock`)."""
    from prefect.runtime import flow_run

    from espnet3_prefect.execution.api_reach import server_gone

    reason = server_gone()
    try:
        if reason is not None and flow_run.id:
            note = {"flow_run_id": str(flow_run.id), "reason": reason}
            atomic_write_text(Path(folder) / UNREPORTED_NAME, json.dumps(note))
    finally:
        lock.release()
