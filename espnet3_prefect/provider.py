"""Providers build the per-worker env (dataset, model, ...) as a plain dict.

ESPnet3 contracts: ``EnvironmentProvider.build_env_local()`` builds the env in this process,
``build_worker_setup_fn()`` returns a picklable no-argument function that builds it on a worker.
``InferenceProvider`` builds ``{"dataset": ..., "model": ..., **params}`` from the stage config.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable, Mapping

from omegaconf import DictConfig, OmegaConf

from .errors import ConfigError
from .targets import instantiate, locate


class EnvironmentProvider:
    """Base class: subclass and implement :meth:`build_env_local`.

    >>> class Const(EnvironmentProvider):
    ...     def build_env_local(self): return {"k": 1}
    >>> Const({}).build_worker_setup_fn()()
    {'k': 1}
    """

    def __init__(self, config: Any = None):
        self.config = config

    def build_env_local(self) -> dict[str, Any]:
        """The env for this process: a plain dict of named entries injected into ``forward``."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement build_env_local()")

    def build_worker_setup_fn(self) -> Callable[[], dict[str, Any]]:
        """A picklable no-argument function that builds the env on a worker (default: local build)."""
        return _BuildLocal(self)

    def make_worker_setup_fn(self) -> Callable[[], dict[str, Any]]:
        """Older ESPnet3 name of :meth:`build_worker_setup_fn`."""
        return self.build_worker_setup_fn()


class _BuildLocal:
    def __init__(self, provider: EnvironmentProvider):
        self.provider = provider

    def __call__(self) -> dict[str, Any]:
        return self.provider.build_env_local()


class InferenceProvider(EnvironmentProvider):
    """Builds ``dataset`` and ``model`` for one test set (``config.test_set``), plus ``params``.

    Override the static :meth:`build_dataset` / :meth:`build_model` for recipe-specific logic.
    """

    def __init__(self, inference_config: Any = None, params: Mapping[str, Any] | None = None, **aliases: Any):
        config = inference_config
        for name in ("infer_config", "config"):
            if name in aliases:
                config = aliases.pop(name)
        if aliases:
            raise TypeError(f"InferenceProvider got unexpected arguments: {', '.join(sorted(aliases))}")
        super().__init__(config)
        self.params = dict(params or {})

    def build_env_local(self) -> dict[str, Any]:
        cls = type(self)
        return {"dataset": cls.build_dataset(self.config), "model": cls.build_model(self.config), **self.params}

    @staticmethod
    def build_dataset(config: DictConfig) -> Any:
        """Instantiate ``config.dataset`` (a data organizer) and return its ``test[config.test_set]``."""
        if OmegaConf.select(config, "dataset._target_") is None:
            raise ConfigError("dataset._target_: missing; name a data organizer class or override build_dataset()")
        organizer = instantiate(config.dataset)
        try:
            return organizer.test[config.test_set]
        except (KeyError, AttributeError, TypeError):
            raise ConfigError(f"dataset: the organizer has no test set {config.test_set!r}") from None

    @staticmethod
    def build_model(config: DictConfig) -> Any:
        """Instantiate ``config.model`` on :func:`resolve_device`'s device, in eval mode."""
        if OmegaConf.select(config, "model._target_") is None:
            raise ConfigError("model._target_: missing; name a model class or override build_model()")
        device = resolve_device(config)
        target = locate(config.model._target_)
        takes_device = _accepts_kwarg(target, "device")
        model = instantiate(config.model, device=device) if takes_device else instantiate(config.model)
        if not takes_device and hasattr(model, "to"):
            model = model.to(device)
        if hasattr(model, "eval"):
            model.eval()
        return model


def _accepts_kwarg(target: Any, name: str) -> bool:
    try:
        params = inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False
    return name in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


def resolve_device(config: Any = None) -> str:
    """The torch device for this worker.

    Order: ``config.device`` (unless "auto"); else ``cpu`` without CUDA; else
    ``config.device_index`` or ``$LOCAL_RANK`` modulo the GPUs visible through
    CUDA_VISIBLE_DEVICES; else ``cuda:0`` (dask-cuda puts each worker's own GPU first).

    >>> resolve_device({"device": "cpu"})
    'cpu'
    """
    get = (lambda k: OmegaConf.select(config, k)) if isinstance(config, DictConfig) else (
        lambda k: (config or {}).get(k))
    device = get("device")
    if device and device != "auto":
        return str(device)
    count = _cuda_device_count()
    if count == 0:
        return "cpu"
    index = get("device_index")
    if index is None:
        index = os.environ.get("LOCAL_RANK")
    # CUDA_VISIBLE_DEVICES renumbers the GPUs this process sees from 0; a rank beyond them wraps.
    return f"cuda:{int(index) % count}" if index is not None else "cuda:0"


def _cuda_device_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
