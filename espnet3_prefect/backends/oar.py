"""``env: oar``: OAR through ``dask_jobqueue.OARCluster`` (its queue is not asked here). dask-jobqueue's
OAR script ignores ``log_directory``, so the output files are named with ``-O``/``-E`` here."""

from __future__ import annotations

from .jobqueue import JobqueueBackend
from .walltime import WalltimeFormat


class OarBackend(JobqueueBackend):
    name = "oar"
    cluster_class = "dask_jobqueue.OARCluster"
    extra = "oar"
    walltime = WalltimeFormat("hours", ("H:M", "H:M:S"), "HH:MM:SS")
    job_id_variable = "OAR_JOB_ID"

    def add_log_options(self, options: dict, log_dir: str | None, job_name: str) -> None:
        if not log_dir:
            return
        directives = [str(d) for d in options.get("job_extra_directives") or []]
        if not any(d.split()[0].split("=")[0] in ("-O", "-E", "--stdout", "--stderr") for d in directives if d.split()):
            options["job_extra_directives"] = directives + [f"-O {log_dir}/{job_name}.%jobid%.out",
                                                            f"-E {log_dir}/{job_name}.%jobid%.err"]


BACKENDS = (OarBackend(),)
