"""A checkpoint's ``evaluate`` run in the Prefect API: named and tagged after its checkpoint
(:func:`label_run`), and passed over when a newer checkpoint's run is queued behind it (:func:`newer_run`).
"""

from __future__ import annotations


def newer_run() -> str | None:
    """The name of a run of this run's deployment created after it with ``latest_only``, queued, running
    or done (not failed or cancelled): this run's checkpoint is not the newest any more."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.runtime import flow_run

    if not flow_run.id:
        return None
    with get_client(sync_client=True) as client:
        me = client.read_flow_run(flow_run.id)
        if me.deployment_id is None:
            return None
        waiting = client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[me.deployment_id])),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(
                        any_=[StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.COMPLETED]
                    )
                )
            ),
        )
    newer = [r for r in waiting if r.id != me.id and r.parameters.get("latest_only") and r.created > me.created]
    return max(newer, key=lambda r: r.created).name if newer else None


def label_run(ckpt: dict) -> None:
    """Name this flow run after the checkpoint and tag it, so the UI groups a checkpoint's runs."""
    from prefect import get_client
    from prefect.runtime import flow_run

    if not flow_run.id:
        return
    tags = ["checkpoint", f"checkpoint:{ckpt['name']}", f"sha256:{ckpt['sha256'][:12]}"]
    with get_client(sync_client=True) as client:
        current = client.read_flow_run(flow_run.id)
        client.update_flow_run(
            flow_run.id,
            name=f"evaluate-{ckpt['name']}-{ckpt['sha256'][:8]}",
            tags=sorted(set(current.tags) | set(tags)),
        )
