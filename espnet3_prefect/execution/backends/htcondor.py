"""``env: htcondor``: HTCondor through ``dask_jobqueue.HTCondorCluster``. Its jobs have no walltime in
dask-jobqueue (so no worker lifetime) and need scratch ``disk``; ``job_extra_directives`` may be a
mapping of submit-file keys."""

from __future__ import annotations

from espnet3_prefect.execution.backends.jobqueue import JobqueueBackend


class HtcondorBackend(JobqueueBackend):
    name = "htcondor"
    cluster_class = "dask_jobqueue.HTCondorCluster"
    extra = "htcondor"
    required_options = (("disk", "scratch disk per job, e.g. disk: 10GB"),)
    mapping_options = ("job_extra_directives",)


BACKENDS = (HtcondorBackend(),)
