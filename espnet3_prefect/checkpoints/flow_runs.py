"""A checkpoint's ``evaluate`` run in the Prefect API: named and tagged after its checkpoint
(:func:`label_run`), and passed over when a newer checkpoint's run is queued behind it (:func:`newer_run`).
"""

from __future__ import annotations


def newer_run(flow_run_id=None) -> str | None:
    """The name of a run of this run's deployment created after it with ``latest_only``, queued, running
    or done (not failed or cancelled): this run's checkpoint is not the newest any more.

    The API answers 200 runs a call, in random (id) order unless asked: a deployment with more than
    200 finished evaluations hid the newer run from an unsorted read. This reads newest first, only
    runs expected to start no earlier than this one, page by page until it is past this run.
    """
    from prefect import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterExpectedStartTime,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.client.schemas.sorting import FlowRunSort
    from prefect.runtime import flow_run

    flow_run_id = flow_run_id or flow_run.id
    if not flow_run_id:
        return None
    page_size = 200  # the API's most rows a call
    with get_client(sync_client=True) as client:
        me = client.read_flow_run(flow_run_id)
        if me.deployment_id is None:
            return None
        wanted = dict(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[me.deployment_id])),
            flow_run_filter=FlowRunFilter(
                expected_start_time=FlowRunFilterExpectedStartTime(after_=me.expected_start_time),
                state=FlowRunFilterState(
                    type=FlowRunFilterStateType(
                        any_=[StateType.SCHEDULED, StateType.PENDING, StateType.RUNNING, StateType.COMPLETED]
                    )
                ),
            ),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC,
            limit=page_size,
        )
        offset = 0
        while True:
            page = client.read_flow_runs(**wanted, offset=offset)
            newer = [r for r in page if r.id != me.id and r.parameters.get("latest_only") and r.created > me.created]
            if newer:
                return max(newer, key=lambda r: r.created).name
            if len(page) < page_size:
                return None
            offset += page_size


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
