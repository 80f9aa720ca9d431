"""Build env per worker: the provider's env is built once per worker process and cached here.

The provider's ``build_worker_setup_fn()`` is called on the driver (as ESPnet3 does) and the function
it returns travels to the workers inside an :class:`EnvBuilder`, which adds the keys upstream adds
(``output_dir``, and ``shard_subdir`` when set; ``setdefault``, so a provider's own entry wins).
This module is importable on every worker (never ``__main__``), so the cache outlives tasks.
:class:`EnvPlugin` builds the env on every worker when registered, and on every worker that joins
later; :func:`get_env` builds it lazily wherever the plugin has not (first shard on a worker).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution.rundir import preload_on_main_thread

log = logging.getLogger("espnet3_prefect")
_ENVS: dict[str, dict[str, Any]] = {}
_LOCK = threading.Lock()


@dataclass
class EnvBuilder:
    """A worker's env: the provider's setup function plus the keys the shard hooks need."""

    setup_fn: Callable[[], dict]
    output_dir: str
    shard_subdir: str = ""
    provider_name: str = "provider"

    def __call__(self) -> dict[str, Any]:
        env = self.setup_fn()
        if not isinstance(env, dict):
            raise ConfigError(
                f"{self.provider_name}.build_worker_setup_fn(): the setup function must return a "
                f"dict, got {type(env).__name__}"
            )
        env = dict(env)
        env.setdefault("output_dir", self.output_dir)
        if self.shard_subdir:
            env.setdefault("shard_subdir", self.shard_subdir)
        return env


def get_env(key: str, builder: Callable[[], dict]) -> dict[str, Any]:
    """The env for ``key`` in this process, built by ``builder`` on first use (thread-safe)."""
    with _LOCK:
        env = _ENVS.get(key)
        if env is None:
            log.info("building env %s", key)
            env = _ENVS[key] = builder()
        return env


def drop_env(key: str) -> None:
    """Forget the env for ``key`` (frees the model once nothing else holds it)."""
    with _LOCK:
        _ENVS.pop(key, None)


def cached_keys() -> list[str]:
    """Keys of the envs built in this process."""
    with _LOCK:
        return sorted(_ENVS)


class EnvPlugin(WorkerPlugin):
    """Builds the env on each worker at registration and on each worker that joins later.

    The build runs in a thread, so the worker keeps answering heartbeats while a model loads. As
    ESPnet3's worker plugin does, it sets ``DASK_WORKER_ID`` for the worker's code.
    """

    def __init__(self, key: str, builder: Callable[[], dict]):
        self.key = key
        self.name = f"espnet3-env-{key}"
        self.builder = builder

    async def setup(self, worker) -> None:
        os.environ["DASK_WORKER_ID"] = str(worker.id)
        preload_on_main_thread()
        await asyncio.to_thread(get_env, self.key, self.builder)

    def teardown(self, worker) -> None:
        drop_env(self.key)
