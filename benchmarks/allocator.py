"""Dask's worker allocator setting against ours, on the prefetch benchmark's loading and model.

    .venv/bin/python -m benchmarks.allocator [rounds]

Each round starts a fresh process per setting (Dask's nanny writes its pre-spawn variables into the
parent's environment, so one process cannot measure both), with a one-worker LocalCluster that runs
:func:`benchmarks.audio.calibrate` three times, and prints ms per item (load, compute) for Dask's
defaults (``MALLOC_TRIM_THRESHOLD_=65536`` in the worker) and for ours (the variable left out).
"""

from __future__ import annotations

import subprocess
import sys

from .data_groups import PF_MODEL


def _calibrate() -> tuple[float, float]:
    from benchmarks import audio

    load, compute = audio.calibrate(n=200, **PF_MODEL)
    return round(load * 1000, 2), round(compute * 1000, 2)


def measure(setting: str) -> None:
    import dask
    from distributed import Client, LocalCluster

    from espnet3_prefect.execution.backends.allocator import allocator_settings

    settings = allocator_settings() if setting == "ours" else {}
    with (
        dask.config.set(settings),
        LocalCluster(n_workers=1, threads_per_worker=1, host="127.0.0.1", dashboard_address=None) as cluster,
        Client(cluster) as client,
    ):
        results = [client.submit(_calibrate, pure=False).result() for _ in range(3)]
    print(f"{setting:<13} load, compute ms per item: {results}", flush=True)


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--setting":
        measure(sys.argv[2])
        return
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    for _ in range(rounds):
        for setting in ("dask-default", "ours"):
            subprocess.run([sys.executable, "-m", "benchmarks.allocator", "--setting", setting], check=True)


if __name__ == "__main__":
    main()
