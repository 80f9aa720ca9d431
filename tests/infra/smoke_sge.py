"""Smoke check: dask_jobqueue.SGECluster on the Grid Engine from sge_up.sh -> 2 workers in SGE jobs."""

import os
import subprocess
import sys
import tempfile
import time

from dask.distributed import Client
from dask_jobqueue import SGECluster

STATE = os.environ.get("E3P_INFRA_DIR", os.path.join(tempfile.gettempdir(), "e3p-infra"))


def qstat():  # job ids of all users; the first two lines are the table header
    out = subprocess.run(["qstat", "-u", "*"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines()[2:] if line.strip()]


if __name__ == "__main__":
    t0 = time.time()
    with (
        SGECluster(
            queue=os.environ.get("E3P_SGE_QUEUE", "all.q"),
            cores=1,
            processes=1,
            memory="1GB",
            walltime="00:05:00",
            interface="lo",
            python=sys.executable,
            log_directory=os.path.join(STATE, "logs"),  # else *.o<jobid> files land in $HOME
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
        job_ids = set(client.run(lambda: os.environ.get("JOB_ID")).values())
        print(f"cluster {t1 - t0:.1f} s, 2 workers {t2 - t1:.1f} s, jobs {sorted(job_ids)}, qstat {qstat()}")
        assert len(job_ids) == 2 and None not in job_ids and job_ids <= set(qstat()), job_ids
        assert client.submit(sum, [1, 2, 3]).result() == 6
    t3 = time.time()
    while qstat() and time.time() - t3 < 30:
        time.sleep(0.5)
    assert not qstat(), qstat()
    print(f"closed, qstat empty after {time.time() - t3:.1f} s -- SGE SMOKE OK")
