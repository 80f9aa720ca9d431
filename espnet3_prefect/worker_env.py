"""Build env per worker: the provider's env is built once per worker process and cached here.

This module is importable on every worker (never ``__main__``), so the cache outlives tasks.
:class:`EnvPlugin` builds the env on every worker when registered, and on every worker that joins
later; :func:`get_env` builds it lazily wherever the plugin has not (first shard on a worker).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from .errors import ConfigError

log = logging.getLogger("espnet3_prefect")
_ENVS: dict[str, dict[str, Any]] = {}
_LOCK = threading.Lock()


def build_env(provider) -> dict[str, Any]:
    """Call the provider's worker setup function and check it returned a plain dict."""
    setup = provider.build_worker_setup_fn()
    env = setup()
    if not isinstance(env, dict):
        raise ConfigError(
            f"provider {type(provider).__qualname__}: worker setup must return a dict, got {type(env).__name__}")
    return env


def get_env(key: str, provider) -> dict[str, Any]:
    """The env for ``key`` in this process, built by ``provider`` on first use (thread-safe)."""
    with _LOCK:
        env = _ENVS.get(key)
        if env is None:
            log.info("building env %s", key)
            env = _ENVS[key] = build_env(provider)
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

    The build runs in a thread, so the worker keeps answering heartbeats while a model loads.
    """

    def __init__(self, key: str, provider):
        self.key = key
        self.name = f"espnet3-env-{key}"
        self.provider = provider

    async def setup(self, worker) -> None:
        await asyncio.to_thread(get_env, self.key, self.provider)

    def teardown(self, worker) -> None:
        drop_env(self.key)
