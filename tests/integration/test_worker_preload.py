"""Local workers import Prefect and our task modules while they start, before their first task."""

from __future__ import annotations

import gc
import logging
import sys

from espnet3_prefect.execution.cluster import open_task_runner
from espnet3_prefect.execution.spec import ParallelSpec
from espnet3_prefect.flows.workers import TASK_PRELOAD
from espnet3_prefect.tasks import preload


def _worker_state(dask_worker) -> dict:
    return {
        "loaded": [name for name in preload.MODULES if name in sys.modules],
        "warmed": getattr(dask_worker, preload.WARMED, None),
        "frozen": gc.get_freeze_count(),
        "gc_enabled": gc.isenabled(),
        "executed": dask_worker.state.executed_count,
    }


def test_every_local_worker_has_the_task_modules_before_any_task(tmp_path):
    spec = ParallelSpec.from_config({"env": "local", "n_workers": 2, "options": {"dashboard_address": None}})
    with open_task_runner(
        spec, log_root=tmp_path, logger=logging.getLogger("test"), worker_preload=TASK_PRELOAD
    ) as runner:
        states = runner.client.run(_worker_state)  # out of band: no task has run on any worker
    assert len(states) == 2
    for state in states.values():
        assert state["executed"] == 0
        assert state["loaded"] == list(preload.MODULES)
        assert state["warmed"] is not None  # dask_setup ran on this worker
        assert state["frozen"] > 0 and state["gc_enabled"]  # import-time objects frozen, collector back on


def test_without_worker_preload_workers_start_bare(tmp_path):
    spec = ParallelSpec.from_config({"env": "local", "n_workers": 1, "options": {"dashboard_address": None}})
    with open_task_runner(spec, log_root=tmp_path, logger=logging.getLogger("test")) as runner:
        [state] = runner.client.run(_worker_state).values()
    assert state["warmed"] is None and "prefect.task_engine" not in state["loaded"]


def _trim_threshold() -> str | None:
    import os

    return os.environ.get("MALLOC_TRIM_THRESHOLD_")


def test_local_workers_keep_glibc_allocator_thresholds_unless_the_user_sets_one(tmp_path, monkeypatch):
    """Dask's nanny exports MALLOC_TRIM_THRESHOLD_=65536 to every worker, which makes each large
    allocation an mmap (a torch model ran 1.7x slower); our local workers do not get it, a value of
    the user's own does reach them, and the driver's Dask config is as it was after the run."""
    import dask

    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    key = "distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_"
    assert dask.config.get(key) == 65536  # Dask's shipped default, what plain LocalCluster workers get
    spec = ParallelSpec.from_config({"env": "local", "n_workers": 1, "options": {"dashboard_address": None}})
    with open_task_runner(spec, log_root=tmp_path, logger=logging.getLogger("test")) as runner:
        assert list(runner.client.run(_trim_threshold).values()) == [None]
    assert dask.config.get(key) == 65536
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "4096")
    with open_task_runner(spec, log_root=tmp_path, logger=logging.getLogger("test")) as runner:
        assert list(runner.client.run(_trim_threshold).values()) == ["4096"]
