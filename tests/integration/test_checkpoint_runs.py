"""``evaluate`` runs of a checkpoint deployment in a real Prefect server: a queued run passes over
when a newer ``latest_only`` run exists, however many runs the deployment has finished before."""

from __future__ import annotations

import asyncio

import pytest

from espnet3_prefect.checkpoints.flow_runs import newer_run

pytestmark = pytest.mark.slow


async def _finished_runs(api_url: str, deployment_id, count: int) -> None:
    from prefect.client.orchestration import PrefectClient
    from prefect.states import Completed

    async with PrefectClient(api_url) as client:
        slots = asyncio.Semaphore(16)

        async def one():
            async with slots:
                await client.create_flow_run_from_deployment(deployment_id, state=Completed())

        await asyncio.gather(*(one() for _ in range(count)))


def test_a_newer_latest_only_run_is_found_behind_hundreds_of_finished_ones(prefect_server):
    """The API answers 200 runs a call in random id order unless sorted: with 300 finished runs the
    unsorted read missed the newer run about one time in three (found by a test of artifacts)."""
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.states import Scheduled

    with SyncPrefectClient(prefect_server) as client:
        flow_id = client.create_flow_from_name("evaluate-many-runs")
        deployment_id = client.create_deployment(flow_id=flow_id, name="checkpoint")
    asyncio.run(_finished_runs(prefect_server, deployment_id, 300))
    with SyncPrefectClient(prefect_server) as client:
        me = client.create_flow_run_from_deployment(deployment_id, parameters={"latest_only": True}, state=Scheduled())
        assert newer_run(me.id) is None
        plain = client.create_flow_run_from_deployment(deployment_id, state=Scheduled())
        assert newer_run(me.id) is None  # a newer run without latest_only does not count
        newer = client.create_flow_run_from_deployment(
            deployment_id, parameters={"latest_only": True}, state=Scheduled()
        )
        assert newer_run(me.id) == newer.name
        assert newer_run(newer.id) is None and newer_run(plain.id) == newer.name
