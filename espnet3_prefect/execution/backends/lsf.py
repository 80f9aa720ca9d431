"""``env: lsf``: IBM Spectrum LSF through ``dask_jobqueue.LSFCluster`` (its queue is not asked here)."""

from __future__ import annotations

from espnet3_prefect.execution.backends.jobqueue import JobqueueBackend
from espnet3_prefect.execution.backends.walltime import WalltimeFormat


class LsfBackend(JobqueueBackend):
    name = "lsf"
    cluster_class = "dask_jobqueue.LSFCluster"
    extra = "lsf"
    walltime = WalltimeFormat("minutes", ("H:M", None), "HH:MM")
    job_id_variable = "LSB_JOBID"


BACKENDS = (LsfBackend(),)
