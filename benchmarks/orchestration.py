"""CPU the orchestration costs: the embedded server's per task run, and a local cluster's worker start.

    .venv/bin/python -m benchmarks.orchestration worker-start N fork|spawn   # one JSON line

``worker-start`` runs in a fresh process: it opens the flows' ``env: local`` cluster of N workers
(``fork``: forked from the fork server that imported Prefect, prefect-dask and our tasks once, as
the flows do now; ``spawn``: each worker a fresh interpreter importing them itself, as before) and
prints the CPU seconds of every process it started (workers, fork server) once all N have
registered, and the wall time to that point.
"""

from __future__ import annotations

import contextlib
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    for proc in procs:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def server_pid(home: Path) -> int:
    return int(json.loads((home / "server.json").read_text())["pid"])


def task_run_count() -> int:
    """Task runs the server knows (``POST /task_runs/count`` of the exported API)."""
    import os
    import urllib.request

    request = urllib.request.Request(
        f"{os.environ['PREFECT_API_URL']}/task_runs/count",
        data=b"{}",
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return int(json.load(resp))


class ServerMeter:
    """The embedded server's CPU seconds and the task runs booked between :meth:`start` and :meth:`stop`."""

    def __init__(self, home: Path):
        self.pid = server_pid(home)

    def start(self) -> None:
        self.cpu0, self.runs0 = tree_cpu_s(self.pid), task_run_count()

    def stop(self, settle_s: float = 3.0) -> tuple[float, int]:
        from espnet3_prefect.server.embedded import _flush_prefect

        _flush_prefect()
        time.sleep(settle_s)  # the server books the last events a moment after they arrive
        return tree_cpu_s(self.pid) - self.cpu0, task_run_count() - self.runs0


@contextlib.contextmanager
def flows_cluster(spec, forkserver_preload: tuple[str, ...] = ()):
    """The cluster the flows open for ``spec`` (our worker preload; with ``forkserver_preload`` its
    workers fork from the fork server), its logs in a temporary folder."""
    from espnet3_prefect.execution.cluster import open_task_runner
    from espnet3_prefect.flows.workers import TASK_PRELOAD

    with (
        tempfile.TemporaryDirectory() as tmp,
        open_task_runner(
            spec,
            log_root=Path(tmp),
            logger=logging.getLogger("bench"),
            worker_preload=TASK_PRELOAD,
            forkserver_preload=forkserver_preload,
        ) as runner,
    ):
        yield runner


def worker_start(n_workers: int, fork: bool) -> dict:
    from espnet3_prefect.execution.spec import ParallelSpec
    from espnet3_prefect.flows.workers import FORKSERVER_PRELOAD

    spec = ParallelSpec.from_config({"env": "local", "n_workers": n_workers, "options": {"dashboard_address": None}})
    started = time.perf_counter()
    with flows_cluster(spec, FORKSERVER_PRELOAD if fork else ()) as runner:
        runner.client.wait_for_workers(n_workers)
        wall = time.perf_counter() - started
        cpu = sum(tree_cpu_s(child.pid) for child in psutil.Process().children())
    return {"cpu_s": cpu, "wall_s": wall}


def measure_worker_start(n_workers: int, fork: bool) -> dict:
    """:func:`worker_start` in a fresh interpreter (a fork server lives as long as its process)."""
    code = [
        sys.executable,
        "-m",
        "benchmarks.orchestration",
        "worker-start",
        str(n_workers),
        "fork" if fork else "spawn",
    ]
    out = subprocess.run(code, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker-start"]:
        print(json.dumps(worker_start(int(sys.argv[2]), sys.argv[3] == "fork")))
    else:
        raise SystemExit(__doc__)
