"""``env: pbs``: PBS Pro / Torque through ``dask_jobqueue.PBSCluster`` (its queue is not asked here)."""

from __future__ import annotations

from espnet3_prefect.execution.backends.jobqueue import JobqueueBackend
from espnet3_prefect.execution.backends.walltime import WalltimeFormat


class PbsBackend(JobqueueBackend):
    name = "pbs"
    cluster_class = "dask_jobqueue.PBSCluster"
    extra = "pbs"
    walltime = WalltimeFormat("seconds", ("M:S", "H:M:S"), "HH:MM:SS")
    job_id_variable = "PBS_JOBID"


BACKENDS = (PbsBackend(),)
