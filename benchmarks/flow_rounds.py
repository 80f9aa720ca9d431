"""infer / plain Dask, round after round in one fresh process: the first flow starts the fork server.

    .venv/bin/python -m benchmarks.flow_rounds [--rounds 2] [--n 10000]   # one JSON line per round

Each round runs ESPnet3's plain-Dask design (:func:`benchmarks.baselines.plain_dask`), then the
``infer`` flow on the same stage (``--n`` items x 3 ms, 2 workers), on one embedded server, with the
server's CPU per task run of that flow. Round 0 is the process's first flow (it starts the fork
server that later flows reuse); run it several times, each a fresh process, and read the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import yaml

from . import baselines, orchestration, synthetic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--n", type=int, default=10_000)
    args = parser.parse_args()
    from espnet3_prefect.server.embedded import prefect_api

    work = Path(tempfile.mkdtemp(prefix="e3p-rounds-"))
    with prefect_api(work / "home", ui=False):
        from espnet3_prefect.config.load import load_config
        from espnet3_prefect.flows.infer import infer
        from espnet3_prefect.pipeline.plan import default_num_shards
        from espnet3_prefect.pipeline.stage import build_stages

        meter, shards = orchestration.ServerMeter(work / "home"), default_num_shards(args.n, 2)
        for rnd in range(args.rounds):
            path = work / f"dask{rnd}.yaml"
            path.write_text(yaml.safe_dump(synthetic.config(str(work / f"dask{rnd}"), args.n, 3.0, 2, shards)))
            started = time.perf_counter()
            baselines.plain_dask(build_stages(load_config([path]))[1][0], args.n, 2, shards, work / f"out{rnd}")
            dask = time.perf_counter() - started
            path = work / f"infer{rnd}.yaml"
            path.write_text(yaml.safe_dump(synthetic.config(str(work / f"infer{rnd}"), args.n, 3.0, 2, None)))
            meter.start()
            started = time.perf_counter()
            infer(config=[str(path)])
            flow = time.perf_counter() - started
            cpu, runs = meter.stop()
            row = {"round": rnd, "plain_dask_s": round(dask, 2), "infer_s": round(flow, 2)}
            row |= {"ratio": round(flow / dask, 3), "server_ms_per_task_run": round(1000 * cpu / max(1, runs), 1)}
            print(json.dumps(row | {"load": round(os.getloadavg()[0], 2)}), flush=True)


if __name__ == "__main__":
    main()
