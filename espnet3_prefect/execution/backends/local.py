"""``env: local`` (a ``distributed.LocalCluster`` of processes) and ``env: local_gpu`` (dask-cuda, one
worker per visible GPU). Both bind the scheduler and dashboards to 127.0.0.1, and both fork their
workers from one preloaded fork server under the flows (:mod:`.forkserver`). ``parallel.tls`` is
off by default here (loopback only); ``tls: true`` gives the cluster Dask's in-memory temporary
certificate (``security=True``): no file is written, workers get it from their parent process."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution.backends import forkserver
from espnet3_prefect.execution.backends.allocator import allocator_settings
from espnet3_prefect.execution.backends.base import LOOPBACK_DASHBOARD, Backend, ClusterContext, keyword_names
from espnet3_prefect.execution.backends.forkserver import KEYS_VAR


class LocalBackend(Backend):
    name = "local"
    cluster_class = "distributed.LocalCluster"
    refuses_scheduler_options = True
    tls_supported = True
    preloads_workers = True  # LocalCluster passes ``preload`` to every worker (ClusterContext.worker_preload)
    defaults: dict[str, Any] = {
        "host": "127.0.0.1",
        "dashboard_address": LOOPBACK_DASHBOARD,
        "threads_per_worker": 1,
        "processes": True,
    }

    def valid_options(self) -> set[str] | None:
        from distributed import LocalCluster, Nanny, Worker

        return keyword_names(LocalCluster, Nanny, Worker)

    def dask_settings(self, spec, context: ClusterContext | None = None) -> dict:
        """Worker processes keep glibc's own allocator thresholds (:mod:`.allocator`); with the
        context's ``forkserver_preload`` they are forked from one server that imported it
        (:mod:`.forkserver`, started here, under the allocator setting)."""
        settings = allocator_settings()
        if context is not None and context.forkserver_preload and self.preloads_workers:
            import dask

            with dask.config.set(settings):
                forkserver.start(context.forkserver_preload, context.stage_modules, context.forkserver_environ)
            settings = {**settings, **forkserver.settings()}
        return settings

    def cluster_kwargs(self, spec, context: ClusterContext) -> dict[str, Any]:
        tls = {"security": True} if self.uses_tls(spec) else {}
        kwargs = {**self.defaults, **spec.options, **tls, "n_workers": spec.n_workers}
        if context.worker_preload and self.preloads_workers:
            kwargs["preload"] = worker_preload(context.worker_preload, spec.options.get("preload"))
        if context.forkserver_preload and self.preloads_workers:  # a fork starts with the server's environment
            kwargs["env"] = forkserver.worker_environ(spec.options.get("env"))
        return kwargs


class LocalGpuBackend(LocalBackend):
    """dask-cuda's ``LocalCUDACluster`` through :mod:`.cuda_cluster`, which keeps the ``env`` we pass
    (dask-cuda would replace it with each worker's ``CUDA_VISIBLE_DEVICES``): forked workers get the
    driver's environment and a user's ``options.env`` with their own GPU laid over them."""

    name = "local_gpu"
    cluster_class = "espnet3_prefect.execution.backends.cuda_cluster.LocalCUDACluster"
    extra = "gpu"
    defaults = {"host": "127.0.0.1", "dashboard_address": LOOPBACK_DASHBOARD}

    def valid_options(self) -> set[str] | None:
        return None  # whatever the installed dask-cuda accepts, checked when it starts

    def before_start(self, spec) -> None:
        check_gpu_count(spec.n_workers, visible_gpu_count())


def with_worker_env(specs: dict, env: Mapping[str, str]) -> dict:
    """dask-cuda's worker specs (``{name: {"cls", "options"}}``) with ``env`` under each worker's own
    ``env`` (its ``CUDA_VISIBLE_DEVICES``, which wins, and ``RAPIDS_NO_INITIALIZE``, which dask-cuda
    sets in the driver for spawned workers to inherit), and those names added to the list a forked
    worker keeps (:data:`.forkserver.KEYS_VAR`, where ``env`` has it).

    >>> spec = with_worker_env({0: {"options": {"env": {"CUDA_VISIBLE_DEVICES": "1"}}}}, {"A": "x", KEYS_VAR: "A"})
    >>> spec[0]["options"]["env"]  # doctest: +NORMALIZE_WHITESPACE
    {'A': 'x', 'ESPNET3_PREFECT_WORKER_ENV_KEYS': 'A,CUDA_VISIBLE_DEVICES,RAPIDS_NO_INITIALIZE',
     'RAPIDS_NO_INITIALIZE': 'True', 'CUDA_VISIBLE_DEVICES': '1'}
    """
    for spec in specs.values():
        options = spec.setdefault("options", {})
        own = {"RAPIDS_NO_INITIALIZE": "True", **{k: str(v) for k, v in (options.get("env") or {}).items()}}
        merged = {**env, **own}
        if KEYS_VAR in merged:
            merged[KEYS_VAR] = ",".join(sorted({*merged[KEYS_VAR].split(","), *own} - {""}))
        options["env"] = merged
    return specs


def worker_preload(ours: tuple[str, ...], theirs: Any) -> list[str]:
    """Our preload modules first, then the user's ``options.preload`` (a name or a list), or, without
    it, Dask's ``distributed.worker.preload`` setting, which an explicit ``preload`` would replace.

    >>> worker_preload(("a",), "b"), worker_preload(("a",), ["a", "c"])
    (['a', 'b'], ['a', 'c'])
    """
    if theirs is None:
        import dask

        theirs = dask.config.get("distributed.worker.preload", default=[])
    theirs = [theirs] if isinstance(theirs, str) else list(theirs or [])
    return [*ours, *(name for name in theirs if name not in ours)]


def visible_gpu_count() -> int:
    """GPUs this process may use: CUDA_VISIBLE_DEVICES when set, else what nvidia-smi lists."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    from espnet3_prefect._internal.proc import CommandError, run_command

    try:
        out = run_command(["nvidia-smi", "-L"], timeout_s=20).stdout
    except CommandError:
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def check_gpu_count(n_workers: int, visible: int) -> None:
    """``local_gpu`` runs one worker per GPU: more workers than visible GPUs is an error."""
    shown = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    if visible == 0:
        raise ConfigError(
            f"parallel.env: 'local_gpu' needs a GPU and none is visible here "
            f"(CUDA_VISIBLE_DEVICES={shown}, nvidia-smi lists none); use env: local to run on CPUs"
        )
    if n_workers > visible:
        raise ConfigError(
            f"parallel.n_workers: {n_workers} exceeds the {visible} visible GPU(s) for env 'local_gpu' "
            f"(CUDA_VISIBLE_DEVICES={shown})"
        )


BACKENDS = (LocalBackend(), LocalGpuBackend())
