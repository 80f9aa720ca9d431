"""The ESPnet3 ``parallel`` block, validated, turned into a prefect-dask ``DaskTaskRunner``.

``env`` picks the Dask cluster class, ``n_workers`` how many workers (or jobs) it starts,
``options`` go to the cluster class unchanged. ``address`` connects to a running scheduler.
Everything is checked before any cluster starts; optional backends are imported lazily.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from .errors import ConfigError, MissingExtraError
from . import jobqueue

# env -> (cluster class, pip extra that provides it)
BACKENDS: dict[str, tuple[str, str | None]] = {
    "local": ("distributed.LocalCluster", None),
    "local_gpu": ("dask_cuda.LocalCUDACluster", "gpu"),
    "slurm": ("dask_jobqueue.SLURMCluster", "slurm"),
    "pbs": ("dask_jobqueue.PBSCluster", "pbs"),
    "sge": ("dask_jobqueue.SGECluster", "sge"),
    "lsf": ("dask_jobqueue.LSFCluster", "lsf"),
    "htcondor": ("dask_jobqueue.HTCondorCluster", "htcondor"),
    "moab": ("dask_jobqueue.MoabCluster", "moab"),
    "oar": ("dask_jobqueue.OARCluster", "oar"),
    "ssh": ("distributed.SSHCluster", "ssh"),
    "kube": ("dask_kubernetes.operator.KubeCluster", "kube"),
}
JOBQUEUE_ENVS = jobqueue.JOBQUEUE_ENVS
# lifetime_margin_s: batch-scheduler workers retire this long before their walltime (see jobqueue.py).
TOP_LEVEL_KEYS = ("env", "n_workers", "options", "address", "num_shards", "lifetime_margin_s",
                  "allow_overwrite_lock")
# Options that only mean something to a batch scheduler; a classic copy-paste mistake under local.
SCHEDULER_ONLY = (
    "queue", "account", "project", "walltime", "job_extra", "job_extra_directives",
    "job_script_prologue", "env_extra", "job_directives_skip", "header_skip", "job_cpu",
    "job_mem", "resource_spec", "log_directory", "shebang", "job_name", "cores", "memory",
)
SSH_OPTIONS = ("hosts", "connect_options", "worker_options", "scheduler_options",
               "worker_class", "remote_python")
_RUNNER_MANAGED = ("asynchronous", "loop", "start")


@dataclass(frozen=True)
class ParallelSpec:
    """A validated ``parallel`` block.

    >>> ParallelSpec.from_config({"env": "local", "n_workers": 2}).n_workers
    2
    """

    env: str = "local"
    n_workers: int = 1
    options: Mapping[str, Any] = field(default_factory=dict)
    address: str | None = None
    num_shards: int | None = None
    lifetime_margin_s: float | None = None
    allow_overwrite_lock: bool = False

    @classmethod
    def from_config(cls, block: Mapping[str, Any] | None) -> "ParallelSpec":
        """Validate a plain-dict ``parallel`` block; ``None`` means local with one worker."""
        block = dict(block or {})
        unknown = sorted(set(block) - set(TOP_LEVEL_KEYS))
        if unknown:
            raise ConfigError(f"parallel.{unknown[0]}: unknown key; valid keys: {', '.join(TOP_LEVEL_KEYS)}")
        overwrite = block.pop("allow_overwrite_lock", False)
        if not isinstance(overwrite, bool):
            raise ConfigError(f"parallel.allow_overwrite_lock: must be true or false, got {overwrite!r}")
        address = block.get("address")
        if address is not None:
            return dataclasses.replace(cls._remote(block, address), allow_overwrite_lock=overwrite)
        env = block.get("env", "local")
        if env not in BACKENDS:
            raise ConfigError(f"parallel.env: unknown backend {env!r}; valid values: {', '.join(BACKENDS)}")
        n_workers = _positive_int("parallel.n_workers", block.get("n_workers", 1))
        num_shards = block.get("num_shards")
        if num_shards is not None:
            num_shards = _positive_int("parallel.num_shards", num_shards)
        options = block.get("options") or {}
        if not isinstance(options, Mapping):
            raise ConfigError(f"parallel.options: must be a mapping, got {type(options).__name__}")
        margin = _lifetime_margin(env, block.get("lifetime_margin_s"))
        _check_options(env, dict(options), margin)
        return cls(env=env, n_workers=n_workers, options=dict(options), num_shards=num_shards,
                   lifetime_margin_s=margin, allow_overwrite_lock=overwrite)

    @classmethod
    def _remote(cls, block: dict, address: Any) -> "ParallelSpec":
        if not isinstance(address, str) or "://" not in address:
            raise ConfigError(f"parallel.address: {address!r} is not a scheduler address like tcp://host:8786")
        for key in ("env", "options", "lifetime_margin_s"):
            if block.get(key) not in (None, {}, ""):
                raise ConfigError(f"parallel.{key}: conflicts with parallel.address (a running scheduler has its own workers)")
        n_workers = _positive_int("parallel.n_workers", block.get("n_workers", 1))
        num_shards = block.get("num_shards")
        num_shards = None if num_shards is None else _positive_int("parallel.num_shards", num_shards)
        return cls(env="address", n_workers=n_workers, address=address, num_shards=num_shards)


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{key}: must be a positive integer, got {value!r}")
    return value


def _lifetime_margin(env: str, value: Any) -> float | None:
    if value is None:
        return None
    if env not in JOBQUEUE_ENVS or env == "htcondor":
        raise ConfigError(f"parallel.lifetime_margin_s: only for envs with a walltime "
                          f"({', '.join(e for e in JOBQUEUE_ENVS if e != 'htcondor')}), not {env!r}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"parallel.lifetime_margin_s: must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _check_options(env: str, options: dict, lifetime_margin_s: float | None = None) -> None:
    for key in _RUNNER_MANAGED:
        if key in options:
            raise ConfigError(f"parallel.options.{key}: managed by espnet3-prefect, remove it")
    if "n_workers" in options:
        raise ConfigError("parallel.options.n_workers: set parallel.n_workers instead")
    if env in ("local", "local_gpu", "ssh"):
        for key in options:
            if key in SCHEDULER_ONLY:
                raise ConfigError(
                    f"parallel.options.{key}: a batch-scheduler option, not valid with env {env!r} "
                    f"(it belongs under env: {'/'.join(JOBQUEUE_ENVS)})")
    if env == "kube":
        jobqueue.check_kube_options(options)
    valid = _valid_options(env)
    if valid is None:
        return
    unknown = sorted(set(options) - valid)
    if unknown:
        raise ConfigError(f"parallel.options.{unknown[0]}: not an option of env {env!r}; valid options: {', '.join(sorted(valid))}")
    if env in JOBQUEUE_ENVS:
        jobqueue.check_options(env, options, lifetime_margin_s)


def _valid_options(env: str) -> set[str] | None:
    """Keyword names the backend accepts, read from its signatures; None where we cannot tell."""
    if env == "ssh":
        return set(SSH_OPTIONS)
    if env == "local":
        from distributed import LocalCluster, Nanny, Worker
        classes = [LocalCluster, Nanny, Worker]
    elif env in JOBQUEUE_ENVS:
        cluster = load_cluster_class(env)
        from dask_jobqueue.core import Job, JobQueueCluster
        classes = [JobQueueCluster, cluster, cluster.job_cls, Job]
    else:  # local_gpu, kube: accept what the installed package accepts, checked when it starts
        return None
    names = set()
    for cls in classes:
        names |= {p.name for p in inspect.signature(cls.__init__).parameters.values()
                  if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    return names - {"self", "scheduler", "n_workers", "job_cls", *_RUNNER_MANAGED}


def load_cluster_class(env: str):
    """Import the cluster class for ``env``; a missing package names the pip extra to install."""
    dotted, extra = BACKENDS[env]
    module_name, _, attr = dotted.rpartition(".")
    try:
        module = importlib.import_module(module_name)
        if env == "ssh":
            importlib.import_module("asyncssh")
    except ImportError as exc:
        missing = getattr(exc, "name", None) or module_name
        raise MissingExtraError(
            f"parallel.env {env!r} needs the package {missing!r}: pip install \"espnet3-prefect[{extra}]\""
        ) from None
    return getattr(module, attr)


def visible_gpu_count() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    from ._proc import CommandError, run_command
    try:
        out = run_command(["nvidia-smi", "-L"], timeout_s=20).stdout
    except CommandError:
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def check_gpu_count(n_workers: int, visible: int) -> None:
    """``local_gpu`` runs one worker per GPU: more workers than visible GPUs is an error."""
    if n_workers > visible:
        shown = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
        raise ConfigError(
            f"parallel.n_workers: {n_workers} exceeds the {visible} visible GPU(s) for env 'local_gpu' "
            f"(CUDA_VISIBLE_DEVICES={shown})")


def worker_lifetime(spec: ParallelSpec) -> "jobqueue.Lifetime | None":
    """When batch-scheduler workers retire (a margin before their walltime); None without a walltime."""
    if spec.env not in JOBQUEUE_ENVS:
        return None
    walltime = jobqueue.effective_walltime(spec.env, spec.options)
    if walltime is None:
        return None
    return jobqueue.worker_lifetime(jobqueue.walltime_seconds(spec.env, walltime), spec.lifetime_margin_s)


def cluster_kwargs(spec: ParallelSpec, *, job_name: str = "e3p-preview", log_directory: str | None = None,
                   environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Keyword arguments for the cluster class: our loopback-safe defaults, then the user's options.

    ``job_name`` names this run's batch jobs (``options.job_name`` becomes its prefix, see
    :func:`espnet3_prefect.cluster.run_job_name`); ``log_directory`` is the default folder for
    the scheduler's job logs; ``environ`` (default ``os.environ``) supplies the variables
    exported to batch jobs and SSH workers.
    """
    options = dict(spec.options)
    if spec.env in ("local", "local_gpu"):
        defaults = {"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"}
        if spec.env == "local":
            defaults.update(threads_per_worker=1, processes=True)
        return {**defaults, **options, "n_workers": spec.n_workers}
    if spec.env == "ssh":
        return jobqueue.ssh_kwargs(spec.n_workers, options, environ)
    if spec.env in JOBQUEUE_ENVS:
        return jobqueue.jobqueue_kwargs(spec.env, spec.n_workers, options, job_name=job_name,
                                        log_directory=log_directory, lifetime=worker_lifetime(spec),
                                        environ=environ)
    if spec.env == "kube":
        return jobqueue.kube_kwargs(spec.n_workers, options, job_name=job_name, environ=environ)
    return {**options, "n_workers": spec.n_workers}


def adapt_kwargs(spec: ParallelSpec) -> dict[str, Any] | None:
    """Workers that retire before their walltime are replaced: adapt between n_workers and n_workers."""
    if worker_lifetime(spec) is None:
        return None
    return {"minimum": spec.n_workers, "maximum": spec.n_workers}


def build_task_runner(spec: ParallelSpec, **context):
    """A prefect-dask ``DaskTaskRunner`` (our cheaper-to-submit subclass) for a validated spec
    (``context``: see :func:`cluster_kwargs`).

    >>> runner = build_task_runner(ParallelSpec(env="local", n_workers=2))
    >>> runner.cluster_kwargs["n_workers"]
    2
    """
    from .task_runner import ShardTaskRunner

    if spec.address:
        return ShardTaskRunner(address=spec.address)
    cluster_class = load_cluster_class(spec.env)
    if spec.env == "local_gpu":
        check_gpu_count(spec.n_workers, visible_gpu_count())
    return ShardTaskRunner(cluster_class=cluster_class, cluster_kwargs=cluster_kwargs(spec, **context),
                           adapt_kwargs=adapt_kwargs(spec))
