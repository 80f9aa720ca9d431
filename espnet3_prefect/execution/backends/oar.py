"""``env: oar``: OAR through ``dask_jobqueue.OARCluster``; ``oarstat``/``oardel`` for its jobs.

What the real OAR 2.5.9 (tests/infra/oar_up.sh) showed about dask-jobqueue's OAR support, and
what this module does about it:

* its job script ignores ``log_directory``: the output files are named here with ``-O``/``-E``
  (absolute paths; OAR would otherwise write ``OAR.<name>.<id>.stdout`` into the submitting folder);
* it reads the ``#OAR`` lines back like a shell and joins the memory property to your ``-p`` in
  single quotes, so ``-p host='vm'`` reached OAR as ``host=vm`` ("column vm does not exist"): the
  property filter is written here as one ``-p``, and the directives go to ``oarsub`` as OAR itself
  reads a script (:func:`oarsub_argv`);
* ``oarsub`` takes the job's folder from ``$PWD``: jobs are submitted with PWD set to the real cwd
  (:func:`submit_environment`);
* a job stays listed in ``oarstat`` (Running, then Finishing) after the run's flow returned: the
  queue below lists and cancels the run's jobs like for SLURM and Grid Engine.
"""

from __future__ import annotations

import getpass
import json
import math
import os
import re
import shlex
from collections.abc import Mapping
from typing import Any

from espnet3_prefect._internal.proc import run_command
from espnet3_prefect.execution.backends.base import option_error
from espnet3_prefect.execution.backends.jobqueue import JobqueueBackend
from espnet3_prefect.execution.backends.jobs import JobQueue, QueuedJob
from espnet3_prefect.execution.backends.walltime import WalltimeFormat

NO_MEMORY_PROPERTY = "not_applicable"  # dask-jobqueue's value for "no memory property"
_DIRECTIVE_LINE = re.compile(r"#OAR\s+(\S+)\s*(.*?)\s*$")
_PROPERTY_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class OarQueue(JobQueue):
    """OAR 2.5: ``oarstat -J`` lists the current jobs (Waiting ... Finishing) as JSON, and prints
    nothing at all when there are none. A job stays listed while it is Finishing (about 2 s after
    ``oardel`` on the real OAR) and ends in state Error when ``oardel`` ended it."""

    list_command = "oarstat"
    ended_states = ("Finishing", "Terminated", "Error", "toError")

    def jobs(self) -> list[QueuedJob]:
        out = run_command(["oarstat", "-u", getpass.getuser(), "-J"], timeout_s=30).stdout
        if not out.strip():
            return []
        jobs = [
            QueuedJob(str(job_id), str(info.get("name") or ""), str(info.get("state") or ""))
            for job_id, info in json.loads(out).items()
        ]
        return sorted(jobs, key=lambda j: int(j.job_id) if j.job_id.isdigit() else 0)

    def cancel(self, job_ids: list[str]) -> None:
        if job_ids:
            run_command(["oardel", *job_ids], timeout_s=30, check=False)


class OarBackend(JobqueueBackend):
    name = "oar"
    cluster_class = "dask_jobqueue.OARCluster"
    extra = "oar"
    walltime = WalltimeFormat("hours", ("H:M", "H:M:S"), "HH:MM:SS")
    queue = OarQueue()
    job_id_variable = "OAR_JOB_ID"

    def check_options(self, options: dict, lifetime_margin_s: float | None) -> None:
        super().check_options(options, lifetime_margin_s)
        self.memory_property(options)  # a name OAR can read, checked with the config

    def memory_property(self, options: Mapping[str, Any]) -> str | None:
        """The memory-per-core property name in use (options, else dask config); None when off."""
        name = options.get("memory_per_core_property_name", self._configured("memory-per-core-property-name"))
        if name in (None, "", NO_MEMORY_PROPERTY):
            return None
        if not isinstance(name, str) or not _PROPERTY_NAME.fullmatch(name):
            raise option_error(
                "memory_per_core_property_name",
                f"must be an OAR property name (see oarnodes) or {NO_MEMORY_PROPERTY!r}, got {name!r}",
            )
        return name

    def adjust_options(self, options: dict, log_dir: str | None, job_name: str) -> None:
        """OAR's directives the way the real OAR needs them.

        * ``-O``/``-E`` into the log folder (absolute), unless your directives have their own: a job
          whose output files cannot be created in the submitting folder ends in Error.
        * One property filter: OAR keeps only the last ``-p``, so your last ``-p`` and the memory per
          core (memory / cores in MiB, rounded up, as dask-jobqueue computes it) become one
          ``-p (<yours>) AND <property>>=<MiB>``, and dask-jobqueue adds none of its own.
        """
        from dask.utils import parse_bytes

        directives = [str(d).strip() for d in options.get("job_extra_directives") or [] if str(d).strip()]
        flags = {_directive(d)[0] for d in directives}
        if log_dir:
            base = os.path.abspath(os.path.expanduser(str(log_dir)))
            if not flags & {"-O", "--stdout"}:
                directives.append(f"-O {base}/{job_name}.%jobid%.out")
            if not flags & {"-E", "--stderr"}:
                directives.append(f"-E {base}/{job_name}.%jobid%.err")
        prop = self.memory_property(options)
        if prop is not None:
            memory = options.get("memory", self._configured("memory"))
            cores = options.get("cores", self._configured("cores"))
            mib = math.ceil(parse_bytes(str(memory)) / (int(cores) * 2**20))
            filters = [value for flag, value in map(_directive, directives) if flag in ("-p", "--property")]
            directives = [d for d in directives if _directive(d)[0] not in ("-p", "--property")]
            directives.append(f"-p ({filters[-1]}) AND {prop}>={mib}" if filters else f"-p {prop}>={mib}")
            options["memory_per_core_property_name"] = NO_MEMORY_PROPERTY  # ours replaces dask-jobqueue's
        options["job_extra_directives"] = directives

    def submit_job_class(self, base: type) -> type:
        """``base`` submitting :func:`oarsub_argv` (and cancelling) with :func:`submit_environment`."""

        class OarJob(base):
            async def _submit_job(self, script_filename):
                with open(script_filename) as handle:
                    return await self._call(oarsub_argv(handle.read(), self.submit_command))

            @staticmethod
            async def _call(cmd, *, shell=False, **kwargs):
                kwargs.setdefault("env", submit_environment())
                return await base._call(cmd, shell=shell, **kwargs)

        OarJob.__name__ = OarJob.__qualname__ = base.__name__
        return OarJob

    def submitted_text(self, job_script: str) -> str:
        """The ``oarsub`` command line: the script is submitted inline, so its shebang and comment
        lines never reach OAR; what is shown is what is submitted."""
        return oarsub_text(job_script)

    def preview(self, spec, kwargs: Mapping[str, Any]) -> tuple[str, str]:
        kind, script = super().preview(spec, kwargs)
        return kind, self.submitted_text(script)


def _directive(directive: Any) -> tuple[str, str]:
    """``"-p host='n1'"`` -> ``("-p", "host='n1'")``: the option, then the rest of the line as is."""
    flag, _, value = str(directive).strip().partition(" ")
    return flag, value.strip()


def oarsub_argv(job_script: str, submit_command: str = "oarsub") -> list[str]:
    """The command line that submits ``job_script``: each ``#OAR`` line read the way oarsub reads
    a script (the option, then the rest of the line as one value, quotes included), the other
    lines as the inline command (no shebang, no comments: OAR runs it with the user's shell).

    >>> oarsub_argv("#!/bin/sh\\n#OAR -n job\\n#OAR -p host='n1'\\necho hi\\n")
    ['oarsub', '-n', 'job', '-p', "host='n1'", 'echo hi\\n']
    """
    argv = shlex.split(submit_command)
    lines = job_script.splitlines(keepends=True)
    for line in lines:
        match = _DIRECTIVE_LINE.match(line)
        if match:
            argv += [match.group(1)] + ([match.group(2)] if match.group(2) else [])
    return argv + ["".join(line for line in lines if not line.startswith("#"))]


def _sh_quote(word: str) -> str:
    """A word for a shell: in double quotes when it holds single quotes and nothing else special."""
    if "'" in word and not re.search(r'["$`\\!]', word):
        return f'"{word}"'
    return shlex.quote(word)


def oarsub_text(job_script: str) -> str:
    """:func:`oarsub_argv` as a shell command, one option per line (what ``cluster-script`` shows).

    >>> print(oarsub_text("#OAR -n job\\n#OAR -p host='n1'\\necho hi\\n"), end="")
    oarsub \\
      -n job \\
      -p "host='n1'" \\
      'echo hi
    '
    """
    argv = oarsub_argv(job_script)
    parts, current = [], [argv[0]]
    for word in argv[1:-1]:
        if word.startswith("-") and current:
            parts.append(" ".join(current))
            current = []
        current.append(_sh_quote(word))
    parts.append(" ".join(current))
    parts.append(_sh_quote(argv[-1]))
    return " \\\n  ".join(parts) + "\n"


def submit_environment() -> dict[str, str]:
    """The environment oarsub and oardel run with: ours, with ``PWD`` = the real cwd.

    oarsub takes the job's folder from ``$PWD``. On the real OAR a driver without PWD (a service,
    ``env -i``) had every job refused with only ``[ERROR] Oarsub failed, please verify your request
    syntax.``, and a PWD left from before a ``chdir`` (Prefect runners change folder without a
    shell) would start the jobs in that other folder.
    """
    return {**os.environ, "PWD": os.getcwd()}


BACKENDS = (OarBackend(),)
