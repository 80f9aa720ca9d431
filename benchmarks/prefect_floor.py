"""The Prefect server's own floor per task run: a bare Prefect flow on the same server, beside ours.

    .venv/bin/python -m benchmarks.prefect_floor [--n 10000]   # one JSON line (benchmarks.run: group overhead)

The bare flow is what any user of Prefect and prefect-dask would write: a ``DaskTaskRunner`` on a
2-worker ``LocalCluster``, one short task, as many tasks as an ``infer`` flow has shards that only burn
the same CPU as those shards' forwards, one short task: the task runs of our flow (``build-env``,
``run-shard`` x 32, ``merge``), none of our code. Both are metered on one running server, and both
net of that server's idle rate (its own poll loops, paid whatever runs, so a longer flow pays more):
what is left is what the server did for the flow's task runs, events, logs and artifacts.
"""

from __future__ import annotations

import time

from prefect import flow, task


@task
def burn(cpu_s: float) -> float:
    """Spend ``cpu_s`` of this process's CPU (a forward's cost, no work of ours)."""
    started = time.process_time()
    while time.process_time() - started < cpu_s:
        pass
    return cpu_s


def bare_flow(n_tasks: int, cpu_s_each: float) -> int:
    """Run the bare flow once; the number of task runs it made."""
    from prefect_dask import DaskTaskRunner

    runner = DaskTaskRunner(
        cluster_kwargs={"n_workers": 2, "threads_per_worker": 1, "processes": True, "dashboard_address": None}
    )

    @flow(name="bare-prefect", task_runner=runner)
    def bare() -> int:
        burn.submit(0.01).result()
        done = [f.result() for f in [burn.submit(cpu_s_each) for _ in range(n_tasks)]]
        burn.submit(0.01).result()
        return len(done) + 2

    return bare()


def idle_rate(meter, seconds: float = 10.0) -> float:
    """The server's CPU seconds per second with nothing running."""
    from benchmarks.orchestration import tree_cpu_s

    before = tree_cpu_s(meter.pid)
    time.sleep(seconds)
    return (tree_cpu_s(meter.pid) - before) / seconds


def metered(meter, run) -> dict:
    """``run()`` under ``meter`` (a :class:`benchmarks.orchestration.ServerMeter`): the server's CPU
    seconds, the task runs booked and the seconds metered (the run and the meter's settling)."""
    started = time.perf_counter()
    meter.start()
    run()
    cpu_s, task_runs = meter.stop()
    return {"cpu_s": cpu_s, "task_runs": task_runs, "window_s": time.perf_counter() - started}


def net_ms_per_task_run(cost: dict, idle_cpu_per_s: float) -> float:
    """Server CPU per task run, less what the idle server would have spent over the same window.

    >>> net_ms_per_task_run({"cpu_s": 2.0, "task_runs": 34, "window_s": 20.0}, 0.02)
    47.1
    """
    return round(1000 * (cost["cpu_s"] - idle_cpu_per_s * cost["window_s"]) / max(1, cost["task_runs"]), 1)


def main() -> None:
    import argparse
    import json
    import tempfile
    from pathlib import Path

    import yaml

    from benchmarks import orchestration, synthetic
    from espnet3_prefect.pipeline.plan import default_num_shards
    from espnet3_prefect.server.embedded import prefect_api

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="e3p-floor-"))
    with prefect_api(work / "home", ui=False):
        from espnet3_prefect.flows.infer import infer

        meter = orchestration.ServerMeter(work / "home")
        path = work / "infer.yaml"
        path.write_text(yaml.safe_dump(synthetic.config(str(work / "infer"), args.n, 3.0, 2, None)))
        infer(config=[str(path)])  # the fork server, the server's routes: a later flow's case for both
        shards = default_num_shards(args.n, 2)
        idle = idle_rate(meter)
        path.write_text(yaml.safe_dump(synthetic.config(str(work / "again"), args.n, 3.0, 2, None)))
        ours = metered(meter, lambda: infer(config=[str(path)]))
        bare = metered(meter, lambda: bare_flow(shards, args.n * 0.003 / shards))
        row = {"idle_core_pct": round(100 * idle, 2), "ours": ours, "bare_prefect": bare}
        row |= {f"{k}_net_ms_per_task_run": net_ms_per_task_run(v, idle) for k, v in (("ours", ours), ("bare", bare))}
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
