"""Per-task cost of the task runners, side by side on one LocalCluster and one Prefect server.

    .venv/bin/python -m benchmarks.task_runner_overhead [--tasks 64] [--rounds 3] [--api-in-settings-only]
                                                        [--runner module:Class ...] [--without-stock]

For each runner (prefect-dask's ``DaskTaskRunner``, our ``ShardTaskRunner``, and any ``--runner``),
a flow submits ``--tasks`` no-op tasks and waits for their results; the cost per task is the time
from the first submit to the last result, divided by the number of tasks (2 workers share the
worker-side part). Flow start and end are not counted. The median over ``--rounds`` rounds in
which the runners take turns (so load from other processes falls on every runner alike). The
cluster (2 worker processes) is started once; runners connect to it by address.
``--api-in-settings-only`` starts it without
PREFECT_API_URL in the environment (the URL stays in Prefect's settings), so the runner must ship
the settings to the workers.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import tempfile
import time
from pathlib import Path

from prefect import flow, task


@task
def noop(i: int) -> int:
    return i


@flow(name="noop-tasks", log_prints=False)
def submit_all(n: int) -> float:
    """Seconds from the first submit to the last result of ``n`` no-op tasks."""
    started = time.perf_counter()
    assert sum(f.result() for f in noop.map(range(n))) == n * (n - 1) // 2
    return time.perf_counter() - started


def _per_task(runner_class, address: str, n: int) -> float:
    return submit_all.with_options(task_runner=runner_class(address=address))(n) / n


def _load(spec: str):
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tasks", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--api-in-settings-only", action="store_true")
    parser.add_argument("--runner", action="append", default=[], help="another runner class, module:Class")
    parser.add_argument("--without-stock", action="store_true", help="leave prefect-dask's DaskTaskRunner out (slow)")
    args = parser.parse_args()
    import distributed
    from prefect_dask import DaskTaskRunner

    from espnet3_prefect.execution.task_runner import ShardTaskRunner
    from espnet3_prefect.server.embedded import prefect_api

    runners = {
        "DaskTaskRunner": DaskTaskRunner,
        "ShardTaskRunner": ShardTaskRunner,
        **{spec: _load(spec) for spec in args.runner},
    }
    if args.without_stock:
        runners.pop("DaskTaskRunner")
    per_task: dict[str, list[float]] = {name: [] for name in runners}
    with tempfile.TemporaryDirectory() as tmp, prefect_api(Path(tmp) / "home", ui=False):
        if args.api_in_settings_only:
            os.environ.pop("PREFECT_API_URL")  # prefect_api restores it on the way out
        with distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, host="127.0.0.1", dashboard_address=None
        ) as cluster:
            for runner in runners.values():  # warm up: imports, worker-side caches
                _per_task(runner, cluster.scheduler_address, 4)
            for _ in range(args.rounds):
                for name, runner in runners.items():
                    per_task[name].append(_per_task(runner, cluster.scheduler_address, args.tasks))
    mode = "API URL in settings only" if args.api_in_settings_only else "API URL exported"
    print(
        f"per-task cost (submit to result, in the flow), median of {args.rounds} rounds, {args.tasks} no-op tasks, "
        f"2 workers, {mode}:"
    )
    for name, values in per_task.items():
        shown = ", ".join(f"{v * 1000:.1f}" for v in values)
        print(f"  {name:40} {statistics.median(values) * 1000:7.1f} ms  ({shown})")


if __name__ == "__main__":
    main()
