"""The record made whole after the run's server was unreachable: what the outage hid, sent once it
answers, and nothing twice.

A shard's task run reaches the server as events its worker's Prefect client sends; while the server
is unreachable that client keeps them in memory and sends them again once it answers
(Prefect 3.9: every 30 s, and with the next event). What a process that ended meanwhile kept is gone
with it: a worker whose cluster closed before the server came back (measured: 22 of 40 shards
recorded when a 40-shard run ended during a 20-s outage), or a driver killed during the outage.

The disk keeps what they lose. Each shard's done marker (its one record of being done, written by the
worker) names the flow run and the task run that finished it and how long it took. :func:`record_shards`
asks the server which of those task runs it lacks as finished, and sends each one's Completed state
as the event its worker would have sent, with the shard's start, end and duration; the event's id is
derived from the task run's, so a second send (by the re-run of a killed driver, or a worker's late
resend meeting ours) is dropped by the server instead of recorded twice. The driver's own steps
(``build-env``, ``merge``) have no marker; they run in processes that outlive the wait for the server.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from espnet3_prefect.disk.layout import DONE_NAME
from espnet3_prefect.disk.marker import read_marker

log = logging.getLogger("espnet3_prefect")

#: the namespace of the ids of the states sent here (one per task run: the server keeps one)
_STATE_IDS = uuid.UUID("0e3b1f2c-5a64-4f55-9c1e-6d2f7a8b9c01")


def finished_here(shard_dirs: Iterable[Path], flow_run_id: str) -> list[dict]:
    """The done markers among ``shard_dirs`` written by the flow run ``flow_run_id``, each with the
    task run that wrote it (``task_run_id``, ``task_key``) and its end (``ended``: the marker's mtime)."""
    found = []
    for shard_dir in shard_dirs:
        marker = read_marker(shard_dir)
        if not marker or marker.get("flow_run_id") != str(flow_run_id) or not marker.get("task_run_id"):
            continue
        try:
            ended = (Path(shard_dir) / DONE_NAME).stat().st_mtime
        except OSError:
            continue
        found.append({**marker, "ended": ended})
    return found


def record_shards(flow_run_id: str, markers: list[dict]) -> int:
    """Send the Completed state of each shard in ``markers`` (:func:`finished_here`) whose task run the
    server lacks as finished; returns how many were sent (0 when it lacks none). Raises when the server
    cannot be asked."""
    if not markers:
        return 0
    from prefect import get_client
    from prefect.client.schemas.filters import TaskRunFilter, TaskRunFilterId

    wanted = {str(m["task_run_id"]): m for m in markers}
    finished: set[str] = set()
    ids = list(wanted)
    with get_client(sync_client=True) as client:
        for at in range(0, len(ids), 200):
            chunk = [uuid.UUID(i) for i in ids[at : at + 200]]
            runs = client.read_task_runs(task_run_filter=TaskRunFilter(id=TaskRunFilterId(any_=chunk)), limit=200)
            finished |= {str(run.id) for run in runs if run.state is not None and run.state.is_final()}
    lacking = [m for i, m in wanted.items() if i not in finished]
    for marker in lacking:
        _send_completed(flow_run_id, marker)
    if lacking:
        from prefect.events.worker import EventsWorker

        EventsWorker.drain_all(timeout=30)
    return len(lacking)


def _send_completed(flow_run_id: str, marker: dict) -> None:
    """The shard's Completed state as the event the server's task-run recorder reads: the task run (its
    flow run named as a related resource), the state, the run's times. Sent from an empty context, so
    Prefect attaches none of the running flow run's resources (a re-run's: the shard would be recorded
    in the re-run, not in the run that did it)."""
    import contextvars

    from prefect.client.schemas.objects import TaskRun
    from prefect.events import emit_event
    from prefect.states import Completed

    task_run_id = uuid.UUID(str(marker["task_run_id"]))
    ended = datetime.fromtimestamp(marker["ended"], tz=UTC)
    took = timedelta(seconds=float(marker.get("seconds") or 0.0))
    state = Completed(message="recorded from its done marker after the server was unreachable", timestamp=ended)
    run = TaskRun(
        id=task_run_id,
        name=f"run-shard-{marker['test_set']}-{marker['index']}",
        flow_run_id=uuid.UUID(str(flow_run_id)),
        task_key=marker.get("task_key") or "run_shard",
        dynamic_key=str(task_run_id),
        run_count=1,
        start_time=ended - took,
        end_time=ended,
        total_run_time=took,
    )
    payload = {
        "intended": {"from": "RUNNING", "to": "COMPLETED"},
        "validated_state": {"type": "COMPLETED", "name": state.name, "message": state.message, "state_details": {}},
        "task_run": run.model_dump(
            mode="json", exclude_none=True, exclude={"id", "created", "updated", "flow_run_id", "state"}
        ),
    }
    contextvars.Context().run(
        emit_event,
        event=f"prefect.task-run.{state.name}",
        resource={
            "prefect.resource.id": f"prefect.task-run.{task_run_id}",
            "prefect.resource.name": run.name,
            "prefect.state-name": state.name,
            "prefect.state-type": "COMPLETED",
            "prefect.orchestration": "client",
        },
        related=[{"prefect.resource.id": f"prefect.flow-run.{flow_run_id}", "prefect.resource.role": "flow-run"}],
        payload=payload,
        occurred=ended,
        id=uuid.uuid5(_STATE_IDS, str(task_run_id)),  # one per task run: a second send is the same event
    )


def shard_dirs_under(folder: Path) -> list[Path]:
    """The shard folders with a done marker under a run lock's folder: ``<folder>/<shard>`` (a runner
    job's) and ``<folder>/<test set>/<shard>`` (the infer stage's)."""
    folder = Path(folder)
    return [done.parent for pattern in (f"*/{DONE_NAME}", f"*/*/{DONE_NAME}") for done in folder.glob(pattern)]


def record_from_markers(shard_dirs: Iterable[Path], flow_run_id: str) -> int:
    """:func:`record_shards` for the markers among ``shard_dirs`` that ``flow_run_id`` wrote; what cannot
    be sent is said at debug level (a report: the run's outcome never depends on it)."""
    try:
        return record_shards(str(flow_run_id), finished_here(shard_dirs, str(flow_run_id)))
    except Exception as exc:  # noqa: BLE001
        log.debug("could not record the shards of flow run %s: %s", flow_run_id, exc)
        return 0


def record_killed_run(folder: Path, flow_run_id: str) -> int:
    """The shards a killed flow run finished under ``folder`` (its run lock's), recorded in it when the
    server lacks them (:func:`record_from_markers`)."""
    return record_from_markers(shard_dirs_under(folder), flow_run_id)
