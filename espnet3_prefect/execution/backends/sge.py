"""``env: sge``: (Son of) Grid Engine through ``dask_jobqueue.SGECluster``; ``qstat``/``qdel`` for its jobs."""

from __future__ import annotations

import getpass
import xml.etree.ElementTree as ET

from espnet3_prefect._internal.proc import run_command
from espnet3_prefect.execution.backends.jobqueue import JobqueueBackend
from espnet3_prefect.execution.backends.jobs import JobQueue, QueuedJob
from espnet3_prefect.execution.backends.walltime import WalltimeFormat


class SgeQueue(JobQueue):
    list_command = "qstat"
    ended_states = ("d", "dr", "dt", "E", "Eqw")

    def jobs(self) -> list[QueuedJob]:
        out = run_command(["qstat", "-u", getpass.getuser(), "-xml"], timeout_s=30).stdout
        jobs = []
        for entry in ET.fromstring(out).iter("job_list"):
            job_id, name, state = (entry.findtext(k, "").strip() for k in ("JB_job_number", "JB_name", "state"))
            if job_id:
                jobs.append(QueuedJob(job_id, name, state))
        return jobs

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            run_command(["qdel", *job_ids], timeout_s=30, check=False)


class SgeBackend(JobqueueBackend):
    name = "sge"
    cluster_class = "dask_jobqueue.SGECluster"
    extra = "sge"
    walltime = WalltimeFormat("seconds", (None, "H:M:S"), "HH:MM:SS")
    queue = SgeQueue()
    job_id_variable = "JOB_ID"


BACKENDS = (SgeBackend(),)
