"""Time from flow start to the first shard on a batch scheduler (default: the local SLURM of tests/infra).

    eval "$(tests/infra/up.sh slurm)"
    .venv/bin/python -m benchmarks.first_shard [--env slurm] [--queue debug] [--repeat 3] [--workers 2]

For each run, read from the Prefect API: flow run start -> start of the first ``run-shard`` task run
(and -> start of ``build-env``, the first task on a worker). One embedded Prefect server for all
runs; each run submits fresh jobs (1 core, 1GB, interface lo).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import yaml

from . import synthetic


def _one(work: Path, i: int, args) -> dict:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from espnet3_prefect.flows.infer import infer

    cfg = synthetic.config(str(work / f"run{i}"), 64, 0.0, args.workers, 8)
    cfg["parallel"] = {
        "env": args.env,
        "n_workers": args.workers,
        "num_shards": 8,
        "options": {
            "queue": args.queue,
            "cores": 1,
            "processes": 1,
            "memory": "1GB",
            "interface": "lo",
            "walltime": "00:10:00",
        },
    }
    path = work / f"run{i}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    state = infer(config=[str(path)], return_state=True)
    run_id = state.state_details.flow_run_id
    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(run_id)
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    start = flow_run.start_time

    def first(prefix: str) -> float:
        return min((t.start_time - start).total_seconds() for t in tasks if t.name.startswith(prefix) and t.start_time)

    return {
        "build_env_s": first("build-env"),
        "first_shard_s": first("run-shard"),
        "total_s": (flow_run.end_time - start).total_seconds(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--env", default="slurm", choices=["slurm", "sge"])
    parser.add_argument("--queue", default=None, help="default: $E3P_SLURM_PARTITION / $E3P_SGE_QUEUE")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    args.queue = (
        args.queue
        or os.environ.get("E3P_SLURM_PARTITION" if args.env == "slurm" else "E3P_SGE_QUEUE")
        or ("debug" if args.env == "slurm" else "all.q")
    )
    from espnet3_prefect.server.embedded import prefect_api

    with tempfile.TemporaryDirectory() as tmp, prefect_api(Path(tmp) / "home", ui=False):
        runs = [_one(Path(tmp), i, args) for i in range(args.repeat)]
    for i, run in enumerate(runs):
        print(
            f"run {i}: flow start -> build-env {run['build_env_s']:.2f} s, -> first run-shard "
            f"{run['first_shard_s']:.2f} s, flow total {run['total_s']:.2f} s"
        )
    print(
        f"median flow start -> first shard on {args.env} ({args.workers} workers): "
        f"{statistics.median(r['first_shard_s'] for r in runs):.2f} s"
    )


if __name__ == "__main__":
    main()
