"""``env: local_gpu`` worker start, forked from the fork server or spawned, and what a worker sees.

    python -m benchmarks.gpu_worker_start      # on a GPU machine: one JSON line per variant and round

Each variant runs in a fresh interpreter (a fork server lives as long as its process), with
``CUDA_VISIBLE_DEVICES`` unset in the driver, and opens the flows' ``local_gpu`` cluster twice:
round 0 is the process's first cluster, round 1 a later one after the driver set ``E3P_T_NEW`` and
dropped ``E3P_T_GONE``. Variants: ``fork`` (the ``infer`` flow's fork server, torch in it),
``spawn`` (no fork server: each worker a fresh interpreter, our preload run in it) and ``before``
(dask-cuda's own class, no preload of ours: ``local_gpu`` as it was). Per round: seconds until the
workers registered, until a CUDA matmul ran in each, the CPU seconds of the processes started, and
each worker's view: parent pid (the driver's or not), ``CUDA_VISIBLE_DEVICES`` (dask-cuda's pinning),
the two variables, whether torch was imported before the first task.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from .orchestration import flows_cluster, tree_cpu_s

ROOT = Path(__file__).resolve().parents[1]


def probe() -> dict:
    torch_before = "torch" in sys.modules
    import torch

    x = torch.ones(1024, 1024, device="cuda")
    torch.cuda.synchronize()
    value = float((x @ x)[0, 0])
    return {
        "ppid": os.getppid(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "RAPIDS_NO_INITIALIZE": os.environ.get("RAPIDS_NO_INITIALIZE"),
        "E3P_T_NEW": os.environ.get("E3P_T_NEW"),
        "E3P_T_GONE": os.environ.get("E3P_T_GONE"),
        "torch_before": torch_before,
        "matmul": value,
        "device": torch.cuda.get_device_name(0),
    }


def one_variant(variant: str) -> None:
    from espnet3_prefect.execution.backends.local import LocalGpuBackend
    from espnet3_prefect.execution.spec import ParallelSpec
    from espnet3_prefect.flows.workers import INFER_FORKSERVER_PRELOAD

    if variant == "before":
        LocalGpuBackend.preloads_workers = False
        LocalGpuBackend.cluster_class = "dask_cuda.LocalCUDACluster"
    preload = INFER_FORKSERVER_PRELOAD if variant == "fork" else ()
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    os.environ["E3P_T_GONE"] = "1"
    spec = ParallelSpec.from_config({"env": "local_gpu", "n_workers": 1, "options": {"dashboard_address": None}})
    for rnd in range(2):
        if rnd == 1:
            os.environ["E3P_T_NEW"] = "1"
            del os.environ["E3P_T_GONE"]
        cpu0 = sum(tree_cpu_s(c.pid) for c in psutil.Process().children())
        started = time.perf_counter()
        with flows_cluster(spec, preload) as runner:
            runner.client.wait_for_workers(1)
            ready = time.perf_counter() - started
            views = list(runner.client.run(probe).values())
            cuda = time.perf_counter() - started
            cpu = sum(tree_cpu_s(c.pid) for c in psutil.Process().children()) - cpu0  # before workers exit
        for view in views:
            view["parent_is_driver"] = view.pop("ppid") == os.getpid()
        row = {"variant": variant, "round": rnd, "ready_s": round(ready, 2), "cuda_ready_s": round(cuda, 2)}
        print(json.dumps(row | {"cpu_s": round(cpu, 2), "workers": views}), flush=True)


def main() -> None:
    for variant in ("before", "spawn", "fork"):
        subprocess.run([sys.executable, "-m", "benchmarks.gpu_worker_start", variant], cwd=ROOT, check=False)


if __name__ == "__main__":
    if sys.argv[1:]:
        one_variant(sys.argv[1])
    else:
        main()
