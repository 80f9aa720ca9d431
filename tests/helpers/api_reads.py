"""Reads of a test's own records from a Prefect server that other tests share.

The API answers at most 200 rows a call, in the order of their random ids unless told otherwise: a
read with no filter finds a given run's artifact only while the server holds fewer than 200 (the
session server passes that mark part-way through the suite, which made a test fail at random). Every
read here filters on the server side, or sorts newest first.
"""

from __future__ import annotations


def artifacts_of(client, flow_run_id) -> list:
    """Every artifact a flow run created (its tasks' included)."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    mine = ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
    return client.read_artifacts(artifact_filter=mine)


def latest_artifact(client, key: str):
    """The newest artifact with ``key``, or None."""
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    found = client.read_artifacts(
        artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), sort=ArtifactSort.CREATED_DESC, limit=1
    )
    return found[0] if found else None


def newest_flow_runs(client, limit: int = 50) -> list:
    """The flow runs that started last, newest first (a test's own run is among them)."""
    from prefect.client.schemas.sorting import FlowRunSort

    return client.read_flow_runs(sort=FlowRunSort.EXPECTED_START_TIME_DESC, limit=limit)
