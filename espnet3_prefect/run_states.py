"""Repair run states Prefect cannot see: shards whose workers died, flow runs whose process died."""

from __future__ import annotations

import logging

log = logging.getLogger("espnet3_prefect")


def mark_task_run_crashed(task_run_id, message: str, *, task=None, name: str | None = None,
                          flow_run_id=None) -> None:
    """Set a task run whose worker was killed to Crashed (prefect#12968).

    Left Running if its events were sent, or never recorded at all if the worker died before
    sending them: then it is created here, Crashed, under the same id and name.
    """
    from prefect import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            try:
                client.set_task_run_state(task_run_id, Crashed(message=message), force=True)
            except Exception as exc:
                if not _not_found(exc) or task is None or flow_run_id is None:
                    raise
                client.create_task_run(task=task, flow_run_id=flow_run_id, dynamic_key=str(task_run_id),
                                       id=task_run_id, name=name, state=Crashed(message=message))
    except Exception as exc:  # reporting must not hide the shard's own failure
        log.warning("could not mark task run %s crashed: %s", task_run_id, exc)


def _not_found(exc: Exception) -> bool:
    from prefect.exceptions import ObjectNotFound

    response = getattr(exc, "response", None)
    return isinstance(exc, ObjectNotFound) or getattr(response, "status_code", None) == 404


def mark_flow_run_crashed(flow_run_id, message: str) -> bool:
    """Set a flow run still Running (its process was killed) to Crashed; True if it was changed."""
    from prefect import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            run = client.read_flow_run(flow_run_id)
            if run.state is None or not (run.state.is_running() or run.state.is_pending()):
                return False
            client.set_flow_run_state(flow_run_id, Crashed(message=message), force=True)
            return True
    except Exception as exc:
        log.warning("could not mark flow run %s crashed: %s", flow_run_id, exc)
        return False
