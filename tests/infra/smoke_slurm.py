"""Smoke check: dask_jobqueue.SLURMCluster on the SLURM from slurm_up.sh -> 2 workers in SLURM jobs."""

import os
import subprocess
import sys
import tempfile
import time

from dask.distributed import Client
from dask_jobqueue import SLURMCluster

STATE = os.environ.get("E3P_INFRA_DIR", os.path.join(tempfile.gettempdir(), "e3p-infra"))


def squeue():
    return subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, check=True).stdout.split()


if __name__ == "__main__":
    t0 = time.time()
    with (
        SLURMCluster(
            queue=os.environ.get("E3P_SLURM_PARTITION", "debug"),
            cores=1,
            processes=1,
            memory="1GB",
            walltime="00:05:00",
            interface="lo",
            python=sys.executable,
            log_directory=os.path.join(STATE, "logs"),  # else slurm-*.out land in the cwd
            local_directory=os.path.join(STATE, "dask-tmp"),
            scheduler_options={"dashboard_address": "127.0.0.1:0"},
            worker_extra_args=["--dashboard-address", "127.0.0.1:0"],  # default binds 0.0.0.0
        ) as cluster,
        Client(cluster) as client,
    ):
        t1 = time.time()
        cluster.scale(2)
        client.wait_for_workers(2, timeout=120)
        t2 = time.time()
        job_ids = set(client.run(lambda: os.environ.get("SLURM_JOB_ID")).values())
        print(f"cluster {t1 - t0:.1f} s, 2 workers {t2 - t1:.1f} s, jobs {sorted(job_ids)}, squeue {squeue()}")
        assert len(job_ids) == 2 and None not in job_ids and job_ids <= set(squeue()), job_ids
        assert client.submit(sum, [1, 2, 3]).result() == 6
    t3 = time.time()
    while squeue() and time.time() - t3 < 30:
        time.sleep(0.5)
    assert not squeue(), squeue()
    print(f"closed, squeue empty after {time.time() - t3:.1f} s -- SLURM SMOKE OK")
