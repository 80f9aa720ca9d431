"""Batch-scheduler (dask-jobqueue) and SSH specifics of the ``parallel`` block.

Three things live here, all pure functions (nothing is submitted, nothing listens):

* checks of ``parallel.options`` that dask-jobqueue would only report deep inside a traceback
  (a string where a list belongs, unparsable memory, a walltime YAML turned into a number);
* our defaults for the cluster keyword arguments (logs in a known folder, worker dashboards
  on loopback, the Prefect API URL and PYTHONPATH exported in the job script, workers that
  retire before the walltime). The user's options always win, except ``job_name``, which
  becomes a prefix of the per-run job name so that cleanup can find this run's jobs;
* rendering the job script a cluster would submit, without starting a scheduler.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import shlex
from dataclasses import dataclass
from typing import Any, Mapping

from .errors import ConfigError

JOBQUEUE_ENVS = ("slurm", "pbs", "sge", "lsf", "htcondor", "moab", "oar")
# Variables every worker needs; exported explicitly in the job script, since not every
# scheduler passes the submitter's environment on (SGE and PBS do not without -V).
EXPORTED_ENV = ("PREFECT_API_URL", "PYTHONPATH")
LIST_OPTIONS = ("job_extra_directives", "job_script_prologue", "worker_extra_args",
                "job_directives_skip", "job_extra", "env_extra", "header_skip", "extra")
LOOPBACK_DASHBOARD = "127.0.0.1:0"
# Walltime formats per scheduler: what a bare number means and what 2 or 3 fields mean.
_WALLTIME_FORMATS = {
    "slurm": ("minutes", ("M:S", "H:M:S"), "MM, MM:SS, HH:MM:SS or D-HH[:MM[:SS]]"),
    "pbs": ("seconds", ("M:S", "H:M:S"), "HH:MM:SS"),
    "moab": ("seconds", ("M:S", "H:M:S"), "HH:MM:SS"),
    "sge": ("seconds", (None, "H:M:S"), "HH:MM:SS"),
    "lsf": ("minutes", ("H:M", None), "HH:MM"),
    "oar": ("hours", ("H:M", "H:M:S"), "HH:MM:SS"),
}


def _fail(key: str, message: str) -> ConfigError:
    return ConfigError(f"parallel.options.{key}: {message}")


def check_options(env: str, options: Mapping[str, Any], lifetime_margin_s: float | None = None) -> None:
    """Catch the common misconfigurations of a jobqueue ``options`` block on one line each."""
    import dask
    from dask.utils import parse_bytes

    for key in LIST_OPTIONS:
        value = options.get(key)
        if value is None:
            continue
        if key == "job_extra_directives" and env == "htcondor" and isinstance(value, Mapping):
            continue  # HTCondor takes a mapping of submit-file keys
        if isinstance(value, str) or not isinstance(value, (list, tuple)):
            raise _fail(key, f"must be a list of strings, got {type(value).__name__} {value!r} "
                             f"(write it as [{value!r}])" if isinstance(value, str) else
                             f"must be a list of strings, got {type(value).__name__}")
        bad = [v for v in value if not isinstance(v, (str, int, float))]
        if bad:
            raise _fail(key, f"must be a list of strings, got an item {bad[0]!r}")
    cores = options.get("cores", dask.config.get(f"jobqueue.{env}.cores", None))
    memory = options.get("memory", dask.config.get(f"jobqueue.{env}.memory", None))
    if cores is None or memory is None:
        missing = "cores" if cores is None else "memory"
        raise _fail(missing, f"required for env {env!r} (cores and memory per job, e.g. cores: 4, memory: 16GB)")
    if isinstance(cores, bool) or not isinstance(cores, int) or cores <= 0:
        raise _fail("cores", f"must be a positive integer, got {cores!r}")
    try:
        if parse_bytes(str(memory)) <= 0:
            raise ValueError
    except (ValueError, TypeError):
        raise _fail("memory", f"cannot read {memory!r} as an amount of memory (e.g. 16GB, 512MiB)") from None
    processes = options.get("processes")
    if processes is not None:
        if isinstance(processes, bool) or not isinstance(processes, int) or processes <= 0:
            raise _fail("processes", f"must be a positive integer, got {processes!r}")
        if processes > cores:
            raise _fail("processes", f"{processes} worker processes per job need at least as many cores, got cores: {cores}")
    if env == "htcondor" and options.get("disk", dask.config.get("jobqueue.htcondor.disk", None)) is None:
        raise _fail("disk", "required for env 'htcondor' (scratch disk per job, e.g. disk: 10GB)")
    walltime = effective_walltime(env, options)
    if walltime is not None:
        seconds = walltime_seconds(env, walltime)
        if lifetime_margin_s is not None:
            worker_lifetime(seconds, lifetime_margin_s)  # raises when the margin leaves nothing


def effective_walltime(env: str, options: Mapping[str, Any]) -> Any:
    """The walltime jobs will get: ``options.walltime`` or dask-jobqueue's configured default."""
    if env not in _WALLTIME_FORMATS:
        return None
    if "walltime" in options:
        return options["walltime"]
    import dask

    return dask.config.get(f"jobqueue.{env}.walltime", None)


def walltime_seconds(env: str, value: Any) -> int:
    """Seconds in a walltime written the way ``env``'s scheduler reads it.

    >>> walltime_seconds("slurm", "1-02:00:00"), walltime_seconds("lsf", "01:30"), walltime_seconds("sge", "3600")
    (93600, 5400, 3600)
    """
    unit, layouts, shown = _WALLTIME_FORMATS[env]
    if not isinstance(value, str):
        hint = " (YAML reads an unquoted 1:00:00 as a number: quote it)" if isinstance(value, int) else ""
        raise _fail("walltime", f"must be a string like {shown!r}, got {value!r}{hint}")
    text = value.strip()
    days = 0
    if env == "slurm" and re.fullmatch(r"\d+-[\d:]+", text):
        day_text, text = text.split("-", 1)
        days = int(day_text)
        fields = text.split(":")
        layout = ("H", "H:M", "H:M:S")[len(fields) - 1] if len(fields) <= 3 else None
    else:
        fields = text.split(":")
        if len(fields) == 1:
            layout = {"seconds": "S", "minutes": "M", "hours": "H"}[unit]
        else:
            layout = layouts[len(fields) - 2] if len(fields) <= 3 else None
    if layout is None or not all(f.isdigit() for f in fields):
        raise _fail("walltime", f"cannot read {value!r} as a walltime for env {env!r} (expected {shown})")
    scale = {"H": 3600, "M": 60, "S": 1}
    total = days * 86400 + sum(int(f) * scale[u] for f, u in zip(fields, layout.split(":")))
    if total <= 0:
        raise _fail("walltime", f"must be longer than zero, got {value!r}")
    return total


@dataclass(frozen=True)
class Lifetime:
    """When workers retire: uniformly in ``[seconds - stagger_s, seconds + stagger_s]``."""

    seconds: int
    stagger_s: int
    margin_s: int

    def worker_args(self) -> list[str]:
        return ["--lifetime", f"{self.seconds}s", "--lifetime-stagger", f"{self.stagger_s}s"]


def default_margin_s(walltime_s: int) -> int:
    """5 % of the walltime, at least 1 minute, at most 10 minutes, and never over a quarter of it.

    >>> default_margin_s(60), default_margin_s(1800), default_margin_s(7200), default_margin_s(86400)
    (15, 90, 360, 600)
    """
    return int(min(600, max(60, walltime_s / 20), walltime_s / 4))


def worker_lifetime(walltime_s: int, margin_s: float | None = None) -> Lifetime:
    """Retire workers at the latest ``margin_s`` before the walltime, staggered so they do not all go at once.

    >>> worker_lifetime(3600)
    Lifetime(seconds=3240, stagger_s=180, margin_s=180)
    """
    margin = default_margin_s(walltime_s) if margin_s is None else int(margin_s)
    stagger = int(min(300, walltime_s / 20))
    lifetime = walltime_s - margin - stagger
    if lifetime - stagger < 10:
        raise ConfigError(f"parallel.lifetime_margin_s: {margin_s} s leaves workers no lifetime within a walltime of "
                          f"{walltime_s} s (needs margin + 2 x {stagger} s stagger + 10 s)")
    return Lifetime(seconds=lifetime, stagger_s=stagger, margin_s=margin)


def _has_flag(args: list, *flags: str) -> bool:
    return any(str(a).split("=", 1)[0] in flags for a in args)


def exported_environment(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of :data:`EXPORTED_ENV` that are set (in ``environ``, default os.environ)."""
    environ = os.environ if environ is None else environ
    return {k: environ[k] for k in EXPORTED_ENV if environ.get(k)}


def jobqueue_kwargs(env: str, n_workers: int, options: Mapping[str, Any], *, job_name: str,
                    log_directory: str | None, lifetime: Lifetime | None,
                    environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Keyword arguments for a dask-jobqueue cluster: our defaults under the user's options."""
    options = dict(options)
    kwargs: dict[str, Any] = {}
    if log_directory is not None:
        kwargs["log_directory"] = log_directory
    scheduler_options = {"dashboard_address": LOOPBACK_DASHBOARD, **(options.pop("scheduler_options", None) or {})}
    worker_args = [str(a) for a in options.pop("worker_extra_args", None) or []]
    if not _has_flag(worker_args, "--dashboard-address", "--no-dashboard", "--dashboard"):
        worker_args += ["--dashboard-address", LOOPBACK_DASHBOARD]
    if lifetime is not None and not _has_flag(worker_args, "--lifetime"):
        worker_args += lifetime.worker_args()
    exports = [f"export {k}={shlex.quote(v)}" for k, v in exported_environment(environ).items()]
    prologue = exports + [str(line) for line in options.pop("job_script_prologue", None) or []]
    options.pop("job_name", None)  # used as the prefix of job_name
    log_dir = options.get("log_directory") or kwargs.get("log_directory")
    if env == "oar" and log_dir:
        # dask-jobqueue's OAR script ignores log_directory: name the output files ourselves
        directives = [str(d) for d in options.get("job_extra_directives") or []]
        if not any(d.split()[0].split("=")[0] in ("-O", "-E", "--stdout", "--stderr") for d in directives if d.split()):
            options["job_extra_directives"] = directives + [f"-O {log_dir}/{job_name}.%jobid%.out",
                                                            f"-E {log_dir}/{job_name}.%jobid%.err"]
    kwargs.update(options)
    kwargs.update(scheduler_options=scheduler_options, worker_extra_args=worker_args,
                  job_name=job_name, n_workers=n_workers)
    if prologue:
        kwargs["job_script_prologue"] = prologue
    return kwargs


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def ssh_kwargs(n_workers: int, options: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``distributed.SSHCluster`` arguments: hosts expanded to ``n_workers``, loopback-safe defaults.

    The first host runs the scheduler; workers cycle over the others. The scheduler listens on
    the first host's address on a free port, dashboards on 127.0.0.1. When every host is a
    loopback address, workers listen on 127.0.0.1 too. Host keys are checked as asyncssh does
    by default (``~/.ssh/known_hosts``) unless ``connect_options.known_hosts`` says otherwise.
    PREFECT_API_URL and PYTHONPATH are set on the remote command line (an ssh session does not
    inherit them).
    """
    options = dict(options)
    hosts = options.get("hosts")
    if not hosts or not isinstance(hosts, (list, tuple)) or len(hosts) < 2 or not all(isinstance(h, str) for h in hosts):
        raise ConfigError("parallel.options.hosts: env 'ssh' needs a list [scheduler_host, worker_host, ...]")
    workers = list(hosts[1:])
    expanded = [hosts[0]] + [workers[i % len(workers)] for i in range(n_workers)]
    all_loopback = all(_is_loopback(h) for h in hosts)
    scheduler_defaults = {"host": "127.0.0.1" if _is_loopback(hosts[0]) else hosts[0], "port": 0,
                          "dashboard_address": LOOPBACK_DASHBOARD}
    worker_defaults: dict[str, Any] = {"nthreads": 1, "dashboard_address": LOOPBACK_DASHBOARD}
    if all_loopback:
        worker_defaults["host"] = "127.0.0.1"
    for key in ("connect_options", "scheduler_options", "worker_options"):
        if options.get(key) is not None and not isinstance(options[key], Mapping):
            raise ConfigError(f"parallel.options.{key}: must be a mapping, got {type(options[key]).__name__}")
    import sys

    env_prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in exported_environment(environ).items())
    python = options.get("remote_python") or sys.executable
    pythons = python if isinstance(python, list) else [python]
    prefixed = [f"{env_prefix} {p}".strip() for p in pythons]
    return {
        **options,
        "hosts": expanded,
        "connect_options": dict(options.get("connect_options") or {}),
        "scheduler_options": {**scheduler_defaults, **(options.get("scheduler_options") or {})},
        "worker_options": {**worker_defaults, **(options.get("worker_options") or {})},
        "remote_python": prefixed if isinstance(python, list) else prefixed[0],
    }


def render_job_script(cluster_class: type, kwargs: Mapping[str, Any]) -> str:
    """The job script ``cluster_class(**kwargs)`` would submit, built without a scheduler or a job.

    The cluster object is created inside a running event loop with ``asynchronous=True`` and never
    awaited, so no scheduler starts and ``n_workers`` is left out so nothing is submitted. The
    scheduler address reads ``tcp://<insert-scheduler-address-here>:8786``.
    """
    from distributed.core import Status

    kwargs = {k: v for k, v in kwargs.items() if k != "n_workers"}
    created = _first_missing(kwargs.get("log_directory"))  # dask-jobqueue creates the folder: undo that

    async def build() -> str:
        cluster = cluster_class(asynchronous=True, **kwargs)
        try:
            return cluster.job_script()
        finally:
            cluster.status = Status.closed  # never started: nothing to close

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        runner = asyncio.run
    else:  # called from async code: build in a thread with its own loop
        from concurrent.futures import ThreadPoolExecutor

        def runner(coro):
            with ThreadPoolExecutor(1) as pool:
                return pool.submit(asyncio.run, coro).result()
    try:
        return runner(build())
    except ValueError as exc:  # dask-jobqueue's own checks, e.g. an unknown keyword
        from .errors import one_line

        raise ConfigError(f"parallel.options: {cluster_class.__name__} rejects them: {one_line(exc)}") from None
    finally:
        if created is not None:
            _remove_empty_tree(created)


def _first_missing(path: Any) -> str | None:
    """The outermost folder of ``path`` that does not exist yet (None when it all exists)."""
    if not path:
        return None
    current = os.path.abspath(os.path.expanduser(str(path)))
    missing = None
    while not os.path.exists(current):
        missing = current
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    return missing


def _remove_empty_tree(top: str) -> None:
    for root, _dirs, _files in os.walk(top, topdown=False):  # deepest first
        try:
            os.rmdir(root)
        except OSError:
            return  # not empty: someone wrote there meanwhile; leave it


KUBE_REQUIRED = ("image",)


def check_kube_options(options: Mapping[str, Any]) -> None:
    """``env: kube`` needs an image with espnet3-prefect and the recipe in it; env/resources are mappings."""
    for key in KUBE_REQUIRED:
        if not options.get(key):
            raise ConfigError(f"parallel.options.{key}: required for env 'kube' "
                              f"(a container image with espnet3-prefect and your recipe installed)")
    for key in ("env", "resources"):
        value = options.get(key)
        if value is not None and not isinstance(value, Mapping):
            raise ConfigError(f"parallel.options.{key}: must be a mapping, got {type(value).__name__}")


def kube_kwargs(n_workers: int, options: Mapping[str, Any], *, job_name: str,
                environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``dask_kubernetes.operator.KubeCluster`` arguments: named after the run, Prefect API URL in the env."""
    options = dict(options)
    env = {**exported_environment(environ), **{str(k): str(v) for k, v in (options.pop("env", None) or {}).items()}}
    return {"name": job_name, **options, "env": env, "n_workers": n_workers}


def render_kube_spec(kwargs: Mapping[str, Any]) -> dict | None:
    """The ``DaskCluster`` resource KubeCluster would create, or None without dask_kubernetes."""
    try:
        from dask_kubernetes.operator import make_cluster_spec
    except ImportError:
        return None
    passed = {k: kwargs[k] for k in ("image", "resources", "env", "worker_command", "scheduler_service_type",
                                     "idle_timeout", "jupyter") if kwargs.get(k) is not None}
    return make_cluster_spec(name=kwargs["name"], n_workers=kwargs.get("n_workers"), **passed)


def dump_yaml(data: Any) -> str:
    """YAML for people: keys in order, repeated blocks written out (no ``&id001`` anchors)."""
    import yaml

    class _Plain(yaml.SafeDumper):
        def ignore_aliases(self, data):
            return True

    return yaml.dump(data, Dumper=_Plain, sort_keys=False)
