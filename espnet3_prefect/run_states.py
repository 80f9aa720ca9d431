"""Repair run states Prefect cannot see: shards whose workers died, flow runs whose process died."""

from __future__ import annotations

import logging

log = logging.getLogger("espnet3_prefect")


def mark_task_run_crashed(task_run_id, message: str) -> None:
    """Set a task run left Running (its worker was killed, prefect#12968) to Crashed."""
    from prefect import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            client.set_task_run_state(task_run_id, Crashed(message=message), force=True)
    except Exception as exc:  # reporting must not hide the shard's own failure
        log.warning("could not mark task run %s crashed: %s", task_run_id, exc)


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
