"""``env: ssh`` with TLS: the run's certificate and key copied to each host over ssh, paths on the
remote command line.

``distributed.SSHCluster`` starts the scheduler and every worker with
``python -m distributed.cli.dask_spec --spec '<JSON>'``: whatever their keyword arguments hold is on
the remote command line, readable by every user of that host (``ps``). So the key never goes there:
before a remote process starts, :class:`_Uploads` opens its own ssh connection, makes a private
folder with ``mktemp -d`` (0700) and writes ``cert.pem``/``key.pem`` into it under ``umask 077``,
sending their contents on the standard input of ``cat``; the process then gets a ``security``
mapping of *paths* (Dask's Scheduler and Worker/Nanny accept one). The folder is removed when the
process is closed. :func:`ssh_cluster` builds the same ``SpecCluster`` as ``SSHCluster`` with these
process classes; without ``tls_directory`` it is ``distributed.SSHCluster`` itself.
"""

from __future__ import annotations

import shlex
from typing import Any

from distributed.deploy.ssh import Scheduler as _SshScheduler
from distributed.deploy.ssh import Worker as _SshWorker

from espnet3_prefect.execution.backends.tls import CERT_NAME, KEY_NAME, RunCertificates


class _Uploads:
    """The remote copy of one run's certificate files for one process (mixed into Dask's classes)."""

    role = ""
    remote_dir: str | None = None

    def __init__(self, *args: Any, tls_directory: str | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._init_tls(tls_directory)

    async def start(self):
        if self.certs is not None:
            await self._upload()
        await super().start()

    async def close(self):
        await self._remove_upload()
        await super().close()

    def _init_tls(self, tls_directory: str | None) -> None:
        self.certs = RunCertificates(tls_directory) if tls_directory else None
        self.remote_dir = None

    async def _upload(self) -> None:
        import asyncssh

        certs = self.certs
        contents = {CERT_NAME: certs.cert_file.read_text(), KEY_NAME: certs.key_file.read_text()}
        async with asyncssh.connect(self.address, **self.connect_options) as conn:
            made = await conn.run('umask 077 && mktemp -d "${TMPDIR:-/tmp}/e3p-tls.XXXXXXXX"', check=True)
            self.remote_dir = str(made.stdout).strip()
            for name, text in contents.items():
                await conn.run(
                    f"umask 077 && cat > {shlex.quote(self.remote_dir + '/' + name)}", input=text, check=True
                )
        self.kwargs["security"] = certs.role_options(self.role, self.remote_dir)
        self.kwargs["protocol"] = "tls"

    async def _remove_upload(self) -> None:
        if not self.remote_dir:
            return
        command = f"rm -rf {shlex.quote(self.remote_dir)}"
        try:
            if self.connection is not None:
                await self.connection.run(command)
            else:  # the process never started: its own connection was not made
                import asyncssh

                async with asyncssh.connect(self.address, **self.connect_options) as conn:
                    await conn.run(command)
            self.remote_dir = None
        except Exception:  # closing must go on; the folder is private and the run's key is not reused
            pass


class TlsSshScheduler(_Uploads, _SshScheduler):
    role = "scheduler"


class TlsSshWorker(_Uploads, _SshWorker):
    role = "worker"


def ssh_cluster(
    hosts: list[str],
    connect_options: dict | None = None,
    worker_options: dict | None = None,
    scheduler_options: dict | None = None,
    worker_class: str = "distributed.Nanny",
    remote_python: str | list[str] | None = None,
    tls_directory: str | None = None,
    **kwargs: Any,
):
    """``distributed.SSHCluster``'s arguments plus ``tls_directory`` (this run's
    :class:`~espnet3_prefect.execution.backends.tls.RunCertificates` folder on this machine): the scheduler on
    ``hosts[0]``, one worker (process group) per other entry, all over TLS with those files."""
    from distributed import SSHCluster
    from distributed.deploy.spec import SpecCluster

    if not tls_directory:
        return SSHCluster(
            hosts,
            connect_options=connect_options or {},
            worker_options=worker_options or {},
            scheduler_options=scheduler_options or {},
            worker_class=worker_class,
            remote_python=remote_python,
            **kwargs,
        )
    pythons = remote_python if isinstance(remote_python, list) else [remote_python] * len(hosts)

    def common(i: int) -> dict:
        return {
            "address": hosts[i],
            "connect_options": connect_options or {},
            "remote_python": pythons[i],
            "tls_directory": tls_directory,
        }

    scheduler = {"cls": TlsSshScheduler, "options": {**common(0), "kwargs": dict(scheduler_options or {})}}
    workers = {
        i - 1: {
            "cls": TlsSshWorker,
            "options": {**common(i), "kwargs": dict(worker_options or {}), "worker_class": worker_class},
        }
        for i in range(1, len(hosts))
    }
    return SpecCluster(
        workers, scheduler, name="SSHCluster", security=RunCertificates(tls_directory).security(), **kwargs
    )
