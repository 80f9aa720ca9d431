"""``env: slurm``: SLURM through ``dask_jobqueue.SLURMCluster``; ``squeue``/``scancel`` for its jobs."""

from __future__ import annotations

import getpass

from espnet3_prefect._internal.proc import run_command
from espnet3_prefect.execution.backends.jobqueue import JobqueueBackend
from espnet3_prefect.execution.backends.jobs import JobQueue, QueuedJob
from espnet3_prefect.execution.backends.walltime import WalltimeFormat


class SlurmQueue(JobQueue):
    list_command = "squeue"
    ended_states = (
        "COMPLETING",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    )

    def jobs(self) -> list[QueuedJob]:
        out = run_command(["squeue", "-h", "-u", getpass.getuser(), "-o", "%i|%j|%T|%r"], timeout_s=30).stdout
        jobs = []
        for line in out.splitlines():
            parts = line.strip().split("|")
            if len(parts) == 4:
                jobs.append(QueuedJob(*parts))
        return jobs

    def final_state(self, job_id: str) -> str | None:
        """How a job that left ``squeue`` ended, while slurmctld still holds it (``MinJobAge``, 300 s by
        default; no accounting database needed): ``CANCELLED``, ``TIMEOUT``, ``PREEMPTED``, ... with its
        reason and exit code, or None when SLURM no longer knows it."""
        done = run_command(["scontrol", "-o", "show", "job", job_id], timeout_s=30, check=False)
        fields = dict(part.split("=", 1) for part in done.stdout.split() if "=" in part)
        if "JobState" not in fields:
            return None
        reason = fields.get("Reason", "None")
        detail = f", reason {reason}" if reason not in ("None", "") else ""
        return f"{fields['JobState']} (exit code {fields.get('ExitCode', '?')}{detail})"

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            run_command(["scancel", *job_ids], timeout_s=30, check=False)


class SlurmBackend(JobqueueBackend):
    name = "slurm"
    cluster_class = "dask_jobqueue.SLURMCluster"
    extra = "slurm"
    walltime = WalltimeFormat("minutes", ("M:S", "H:M:S"), "MM, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]", days=True)
    queue = SlurmQueue()
    job_id_variable = "SLURM_JOB_ID"


BACKENDS = (SlurmBackend(),)
