"""``env: ssh``: ``distributed.SSHCluster`` over asyncssh; the first host runs the scheduler. With
``parallel.tls`` (the default) the cluster is :func:`espnet3_prefect.execution.backends.ssh_tls.ssh_cluster`:
the same processes, over TLS, the run's certificate copied to each host over ssh."""

from __future__ import annotations

import ipaddress
import shlex
import sys
from collections.abc import Mapping
from typing import Any

from espnet3_prefect._internal.util import CLIENT_FILE_PRELOAD
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution.backends.base import (
    LOOPBACK_DASHBOARD,
    Backend,
    ClusterContext,
    exported_environment,
    needs_preload,
)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class SshBackend(Backend):
    name = "ssh"
    cluster_class = "espnet3_prefect.execution.backends.ssh_tls.ssh_cluster"
    extra = "ssh"
    also_needs = ("asyncssh",)
    refuses_scheduler_options = True
    start_at_once = True
    tls_default = tls_supported = tls_files = True

    def valid_options(self) -> set[str] | None:
        return {"hosts", "connect_options", "worker_options", "scheduler_options", "worker_class", "remote_python"}

    def cluster_kwargs(self, spec, context: ClusterContext) -> dict[str, Any]:
        """Hosts expanded to ``n_workers``, loopback-safe defaults.

        The first host runs the scheduler; workers cycle over the others. The scheduler listens on
        the first host's address on a free port, dashboards on 127.0.0.1. When every host is a
        loopback address, workers listen on 127.0.0.1 too. Host keys are checked as asyncssh does
        by default (``~/.ssh/known_hosts``) unless ``connect_options.known_hosts`` says otherwise.
        PREFECT_API_URL and PYTHONPATH are set on the remote command line (an ssh session does not
        inherit them); with an authenticated API, the client file's path instead of the URL, and the
        workers preload :mod:`espnet3_prefect.execution.worker_api`, which reads it. With TLS,
        ``tls_directory`` is this run's certificate folder on this machine.
        """
        options = dict(spec.options)
        hosts = options.get("hosts")
        if (
            not hosts
            or not isinstance(hosts, (list, tuple))
            or len(hosts) < 2
            or not all(isinstance(h, str) for h in hosts)
        ):
            raise ConfigError("parallel.options.hosts: env 'ssh' needs a list [scheduler_host, worker_host, ...]")
        workers = list(hosts[1:])
        expanded = [hosts[0]] + [workers[i % len(workers)] for i in range(spec.n_workers)]
        scheduler_defaults = {
            "host": "127.0.0.1" if _is_loopback(hosts[0]) else hosts[0],
            "port": 0,
            "dashboard_address": LOOPBACK_DASHBOARD,
        }
        worker_defaults: dict[str, Any] = {"nthreads": 1, "dashboard_address": LOOPBACK_DASHBOARD}
        if all(_is_loopback(h) for h in hosts):
            worker_defaults["host"] = "127.0.0.1"
        for key in ("connect_options", "scheduler_options", "worker_options"):
            if options.get(key) is not None and not isinstance(options[key], Mapping):
                raise ConfigError(f"parallel.options.{key}: must be a mapping, got {type(options[key]).__name__}")
        exported = exported_environment(context.environ)
        env_prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in exported.items())
        python = options.get("remote_python") or sys.executable
        pythons = python if isinstance(python, list) else [python]
        prefixed = [f"{env_prefix} {p}".strip() for p in pythons]
        worker_options = {**worker_defaults, **(options.get("worker_options") or {})}
        if needs_preload(exported):
            preload = worker_options.get("preload") or []
            preload = [preload] if isinstance(preload, str) else list(preload)
            worker_options["preload"] = preload if CLIENT_FILE_PRELOAD in preload else [*preload, CLIENT_FILE_PRELOAD]
        tls = {}
        if self.uses_tls(spec):
            tls["tls_directory"] = (
                str(context.certificates.directory)
                if context.certificates is not None
                else "<a private temporary folder, made per run>"
            )
        return {
            **options,
            **tls,
            "hosts": expanded,
            "connect_options": dict(options.get("connect_options") or {}),
            "scheduler_options": {**scheduler_defaults, **(options.get("scheduler_options") or {})},
            "worker_options": worker_options,
            "remote_python": prefixed if isinstance(python, list) else prefixed[0],
        }

    def start_error_hint(self, exc: BaseException) -> str:
        name = type(exc).__name__
        if "HostKey" in name or "host key" in str(exc).lower():
            return " (check parallel.options.connect_options.known_hosts)"
        if "Permission" in name or "auth" in str(exc).lower():
            return " (check parallel.options.connect_options: username, client_keys)"
        return ""


BACKENDS = (SshBackend(),)
