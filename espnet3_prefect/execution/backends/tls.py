"""Per-run TLS certificates for the Dask scheduler, its workers and the flow's client.

Dask ships pickled functions: whoever can open a connection to the scheduler can run code as the
user who started the run. On batch schedulers and ssh the scheduler listens on the cluster network,
so by default (``parallel.tls``, see :func:`tls_enabled`) every run gets a fresh self-signed
certificate and key, written to a private folder, and the scheduler, the workers and the flow's
client all require it (``require_encryption``): a peer without the key cannot complete the TLS
handshake, so it cannot submit anything.

* :class:`RunCertificates` is the folder: ``cert.pem`` (the certificate, also the CA every peer
  trusts) and ``key.pem``, files 0600 in a folder 0700, created only by :meth:`RunCertificates.create`
  and removed by :meth:`RunCertificates.remove`. Workers get the *paths* (job script, ssh
  command line), never the key material.
* Batch schedulers: the folder is ``<job log folder>/tls-<job name>`` (or under
  ``options.shared_temp_directory``): a path the compute nodes share, like the job logs.
* ssh: a private temporary folder on this machine; :mod:`espnet3_prefect.execution.backends.ssh_tls`
  copies the two files to each remote host over the ssh connection (on standard input).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from espnet3_prefect._internal.util import private_folder, write_private
from espnet3_prefect.errors import ConfigError

CERT_NAME = "cert.pem"
KEY_NAME = "key.pem"
DIR_PREFIX = "tls-"
ROLES = ("client", "scheduler", "worker")


def tls_enabled(backend, value: Any) -> bool:
    """``parallel.tls`` for ``backend``: its default when unset; a one-line error for a wrong type or
    for ``true`` where the backend cannot do TLS.

    >>> from espnet3_prefect.execution import backends
    >>> tls_enabled(backends.get("slurm"), None), tls_enabled(backends.get("local"), None)
    (True, False)
    >>> tls_enabled(backends.get("slurm"), "no")
    Traceback (most recent call last):
    ...
    espnet3_prefect.errors.ConfigError: parallel.tls: must be true or false, got 'no'
    """
    if value is None:
        return backend.tls_default
    if not isinstance(value, bool):
        raise ConfigError(f"parallel.tls: must be true or false, got {value!r}")
    if value and not backend.tls_supported:
        raise ConfigError(
            f"parallel.tls: not available for env {backend.name!r} (its scheduler and workers "
            f"are set up by {backend.cluster_class}); remove the key or set it to false"
        )
    return value


def check_tls_options(options: dict, tls: bool) -> None:
    """``security`` is ours; ``protocol`` must agree with ``parallel.tls`` (top level and, for ssh,
    under ``scheduler_options``/``worker_options``); ``shared_temp_directory`` (where the batch
    schedulers' certificate folder goes) needs TLS. Each conflict is one line naming the key."""
    if "shared_temp_directory" in options and not tls:
        raise ConfigError(
            "parallel.options.shared_temp_directory: only holds the TLS certificates, and parallel.tls "
            "is false; remove it"
        )
    places = [("", options)] + [
        (f"{key}.", options[key])
        for key in ("scheduler_options", "worker_options")
        if isinstance(options.get(key), dict)
    ]
    for prefix, mapping in places:
        if "security" in mapping:
            raise ConfigError(
                f"parallel.options.{prefix}security: set by espnet3-prefect; use parallel.tls "
                f"(true: per-run certificates, false: plain tcp)"
            )
        protocol = mapping.get("protocol")
        if protocol is None:
            continue
        is_tls = str(protocol).rstrip(":/") == "tls"
        if tls and not is_tls:
            raise ConfigError(
                f"parallel.options.{prefix}protocol: {protocol!r} conflicts with parallel.tls: true "
                f"(set parallel.tls: false to use another protocol)"
            )
        if is_tls and not tls:
            raise ConfigError(f"parallel.options.{prefix}protocol: 'tls' needs parallel.tls: true")


class RunCertificates:
    """The certificate folder of one run (paths only until :meth:`create`).

    >>> certs = RunCertificates("/shared/logs/tls-e3p-0123456789")
    >>> certs.paths()
    {'cert': '/shared/logs/tls-e3p-0123456789/cert.pem', 'key': '/shared/logs/tls-e3p-0123456789/key.pem'}
    """

    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)

    @property
    def cert_file(self) -> Path:
        return self.directory / CERT_NAME

    @property
    def key_file(self) -> Path:
        return self.directory / KEY_NAME

    def paths(self) -> dict[str, str]:
        return {"cert": str(self.cert_file), "key": str(self.key_file)}

    @classmethod
    def in_folder(cls, parent: str | os.PathLike, job_name: str) -> RunCertificates:
        """The folder ``<parent>/tls-<job name>`` (not created)."""
        return cls(Path(parent) / f"{DIR_PREFIX}{job_name}")

    @classmethod
    def temporary(cls, job_name: str) -> RunCertificates:
        """A fresh private folder under the system's temporary folder, certificates created."""
        return cls(tempfile.mkdtemp(prefix=f"e3p-{DIR_PREFIX}{job_name}-")).create()

    def create(self) -> RunCertificates:
        """Generate a certificate and key and write them (0600) to the folder (0700, made here; a
        folder left by an earlier attempt of the same run is replaced)."""
        cert_pem, key_pem = generate_pem()
        private_folder(self.directory)
        write_private(self.cert_file, cert_pem)
        write_private(self.key_file, key_pem)
        return self

    def remove(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def security(self):
        """A ``distributed.Security`` for every role from these files, encryption required."""
        from distributed.security import Security

        files = {f"tls_{role}_{kind}": path for role in ROLES for kind, path in self.paths().items()}
        return Security(tls_ca_file=str(self.cert_file), require_encryption=True, **files)

    def role_options(self, role: str, directory: str | None = None) -> dict[str, Any]:
        """``Security`` keyword arguments for one role, as plain data (for a spec on a command line),
        with the files in ``directory`` (a remote copy) instead of this folder."""
        folder = directory or str(self.directory)
        return {
            "tls_ca_file": f"{folder}/{CERT_NAME}",
            f"tls_{role}_cert": f"{folder}/{CERT_NAME}",
            f"tls_{role}_key": f"{folder}/{KEY_NAME}",
            "require_encryption": True,
        }

    def __repr__(self) -> str:
        return f"RunCertificates({str(self.directory)!r})"


def generate_pem() -> tuple[str, str]:
    """A fresh self-signed certificate and its private key, PEM text (distributed's generator)."""
    from distributed.security import Security

    try:
        made = Security.temporary()
    except ImportError:
        raise ConfigError(
            "parallel.tls: generating certificates needs the package 'cryptography' "
            "(pip install cryptography), or set parallel.tls: false"
        ) from None
    return made.tls_scheduler_cert, made.tls_scheduler_key
