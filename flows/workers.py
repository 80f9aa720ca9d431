"""What the flows' workers have imported before their first task, and the fork server started early.

:data:`TASK_PRELOAD` is the Dask preload every worker imports while it starts; on ``env: local`` and
``local_gpu`` the workers are forked from one fork server per driver process that imported
:data:`FORKSERVER_PRELOAD` (``infer``: :data:`INFER_FORKSERVER_PRELOAD`) and the stage's own modules
(:func:`stage_modules`: its model's, its provider's, its runner's and its dataset's, as this process
imported them while it checked the config), so N workers pay those imports once, not N times.

:func:`fork_server_beside` starts that fork server beside the start of the run's Prefect server,
while this process would only wait: two cores import at once, the server's and the workers'.
This module imports no Prefect (the front doors call it before the API is set).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from espnet3_prefect.tasks import preload  # imports no Prefect

#: what every worker imports while it starts (``open_task_runner(..., worker_preload=TASK_PRELOAD)``)
TASK_PRELOAD = (preload.__name__,)
#: what the fork server of ``env: local`` imports once for all local workers (``forkserver_preload=``)
#: (named, not imported: importing it runs the warm-up, which belongs in the fork server only)
FORKSERVER_PRELOAD = ("espnet3_prefect.tasks.forkserver_warm",)
#: the ``infer`` flow's fork server also imports torch, first (so the warm-up freezes it too): every
#: infer worker imports it anyway (the provider picks its device with it; ESPnet's models are torch),
#: ~1.7 s of CPU each, now once per machine. Not installed: Python skips it. Importing torch starts
#: no CUDA context, so forked workers may still use CUDA.
INFER_FORKSERVER_PRELOAD = ("torch", *FORKSERVER_PRELOAD)


def stage_modules(stages: Iterable[Any]) -> tuple[str, ...]:
    """The modules of the stages' classes that this process has imported: each ``_target_`` (and
    ESPnet3's ``task`` class path) of a stage's config and of its runner's provider's config (its
    longest dotted prefix that is an imported module), and the modules of its runner, of that
    provider and of its provider's worker setup function, first seen first. Only modules already
    imported here are named, so the fork server imports nothing the driver did not (a worker
    imports them anyway to build its env). None where this process sees a CUDA device: a module
    that touches CUDA as it is imported (``torch.cuda.is_available()`` at its top) would leave the
    fork server's children unable to use it, so there each worker imports them itself, as before.

    >>> import json, types
    >>> config = {"model": {"_target_": "json.decoder.JSONDecoder"}, "x": [{"_target_": "no.such.Thing"}]}
    >>> stage_modules([types.SimpleNamespace(config=config, runner=json.JSONEncoder(), builder=None)])
    ('json.decoder', 'json.encoder')
    """
    from espnet3_prefect.config.targets import resolve_target

    if sees_cuda():
        return ()
    found: dict[str, None] = {}
    for stage in stages:
        provider = getattr(stage.runner, "provider", None)  # a run-runner stage's: its config holds the targets
        configs = (stage.config, getattr(provider, "config", None))
        paths = [resolve_target(p) for config in configs for p in _targets(config)]
        builder = getattr(stage, "builder", None)
        for obj in (stage.runner, provider, getattr(builder, "setup_fn", None)):  # the provider's setup function
            paths.append(f"{getattr(obj, '__module__', None) or ''}.x")
        for path in paths:
            module = path.rpartition(".")[0]
            while module and module not in sys.modules:
                module = module.rpartition(".")[0]
            if module and module not in ("__main__", "builtins"):
                found.setdefault(module)
    return tuple(found)


def sees_cuda() -> bool:
    """Whether torch, where this process has imported it, sees a CUDA device (no import here)."""
    torch = sys.modules.get("torch")
    try:
        return bool(torch is not None and torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - a broken CUDA install counts as one: be as careful
        return True


def _targets(config: Any) -> list[str]:
    if isinstance(config, (DictConfig, ListConfig)):
        config = OmegaConf.to_container(config, resolve=False)
    if isinstance(config, dict):
        own = [config[key] for key in ("_target_", "task") if isinstance(config.get(key), str)]
        return own + [t for value in config.values() for t in _targets(value)]
    if isinstance(config, list):
        return [t for value in config for t in _targets(value)]
    return []


def fork_server_beside(spec: Any, stages: Iterable[Any], preload: tuple[str, ...]) -> Callable[[dict], None]:
    """A ``starting`` hook for :func:`~espnet3_prefect.server.embedded.prefect_api`: it starts the fork
    server of ``spec``'s local workers with ``preload`` and the ``stages``' modules, in the run's
    ``PREFECT_HOME``, while the Prefect server starts (nothing on other backends)."""
    modules = stage_modules(stages)

    def start(environ: dict) -> None:
        from espnet3_prefect.execution.cluster import start_fork_server

        start_fork_server(spec, preload, modules, environ)

    return start
