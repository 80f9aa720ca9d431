"""Backends: one per ``parallel.env`` value, looked up in one registry.

    >>> from espnet3_prefect.execution import backends
    >>> backends.names()[:3], backends.get("slurm").batch, backends.get("local").batch
    (['local', 'local_gpu', 'slurm'], True, False)

A backend (:class:`~espnet3_prefect.execution.backends.base.Backend`) validates its options, names its
cluster class and builds its keyword arguments, says whether workers retire before a walltime
(and so whether the cluster adapts), renders the ``cluster-script`` preview and, for batch
schedulers, lists and cancels a run's jobs. A module per family: ``local`` (local, local_gpu),
one per batch scheduler on the ``jobqueue`` base (slurm, pbs, sge, lsf, htcondor, moab, oar),
``ssh``, ``kube``. A new scheduler is one new module defining ``BACKENDS`` (usually a
:class:`~espnet3_prefect.execution.backends.jobqueue.JobqueueBackend` subclass with its walltime format and
queue commands), imported here and named in :data:`BUILTIN_MODULES` (which orders ``names()``);
or a backend :func:`register` ed from outside the package.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from espnet3_prefect._internal.util import is_number
from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution.backends import htcondor, kube, local, lsf, moab, oar, pbs, sge, slurm, ssh
from espnet3_prefect.execution.backends.base import Backend, ClusterContext

if TYPE_CHECKING:
    from espnet3_prefect.execution.spec import ParallelSpec

BUILTIN_MODULES = (local, slurm, pbs, sge, lsf, htcondor, moab, oar, ssh, kube)  # in the order names() lists them
_REGISTRY: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    """Make ``backend`` the one for ``parallel.env: <backend.name>``."""
    _REGISTRY[backend.name] = backend
    return backend


for _module in BUILTIN_MODULES:
    for _backend in _module.BACKENDS:
        register(_backend)


def names() -> list[str]:
    """Every ``parallel.env`` value, in the order error messages list them."""
    return list(_REGISTRY)


def get(env: str) -> Backend:
    """The backend for ``env``; a one-line error listing the valid values otherwise."""
    try:
        return _REGISTRY[env]
    except (KeyError, TypeError):
        raise ConfigError(f"parallel.env: unknown backend {env!r}; valid values: {', '.join(_REGISTRY)}") from None


def batch() -> list[Backend]:
    """The backends whose workers are jobs in a scheduler's queue."""
    return [b for b in _REGISTRY.values() if b.batch]


def validate(env: str, options: dict, lifetime_margin_s: float | None = None, tls: bool | None = None) -> None:
    """Every check of ``parallel.options`` for ``env`` (see :meth:`Backend.validate`)."""
    get(env).validate(options, lifetime_margin_s, batch_envs=tuple(b.name for b in batch()), tls=tls)


def lifetime_margin(env: str, value: Any) -> float | None:
    """``parallel.lifetime_margin_s``: seconds >= 0, only for envs whose workers have a walltime."""
    if value is None:
        return None
    if not get(env).has_walltime:
        with_walltime = ", ".join(name for name, b in _REGISTRY.items() if b.has_walltime)
        raise ConfigError(f"parallel.lifetime_margin_s: only for envs with a walltime ({with_walltime}), not {env!r}")
    if not is_number(value) or value < 0:
        raise ConfigError(f"parallel.lifetime_margin_s: must be a number of seconds >= 0, got {value!r}")
    return float(value)


def cluster_kwargs(spec: ParallelSpec, **context: Any) -> dict[str, Any]:
    """The cluster keyword arguments for ``spec`` (``context``: the fields of :class:`ClusterContext`)."""
    return get(spec.env).cluster_kwargs(spec, ClusterContext(**context))


#: The variables that name the batch job a process runs in, each its backend's ``job_id_variable``, in
#: the order :func:`current_job_id` reads them (the first one set wins: SGE's ``JOB_ID`` before ``PBS_JOBID``).
JOB_ID_VARIABLES: tuple[str, ...] = tuple(
    backend.job_id_variable for module in (slurm, sge, pbs, lsf, oar) for backend in module.BACKENDS
)


def current_job_id() -> str | None:
    """The batch job this process runs in (SLURM_JOB_ID, JOB_ID, PBS_JOBID, ...), or None.

    >>> JOB_ID_VARIABLES
    ('SLURM_JOB_ID', 'JOB_ID', 'PBS_JOBID', 'LSB_JOBID', 'OAR_JOB_ID')
    """
    for name in JOB_ID_VARIABLES:
        if os.environ.get(name):
            return os.environ[name]
    return None


__all__ = [
    "JOB_ID_VARIABLES",
    "Backend",
    "ClusterContext",
    "batch",
    "cluster_kwargs",
    "current_job_id",
    "get",
    "lifetime_margin",
    "names",
    "register",
    "validate",
]
