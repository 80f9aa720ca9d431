"""``env: moab``: Moab through ``dask_jobqueue.MoabCluster`` (its queue is not asked here)."""

from __future__ import annotations

from espnet3_prefect.execution.backends.jobqueue import JobqueueBackend
from espnet3_prefect.execution.backends.walltime import WalltimeFormat


class MoabBackend(JobqueueBackend):
    name = "moab"
    cluster_class = "dask_jobqueue.MoabCluster"
    extra = "moab"
    walltime = WalltimeFormat("seconds", ("M:S", "H:M:S"), "HH:MM:SS")
    job_id_variable = None  # not in backends.JOB_ID_VARIABLES: the summaries' job_id never read MOAB_JOBID


BACKENDS = (MoabBackend(),)
