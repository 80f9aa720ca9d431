"""Providers build the per-worker env (dataset, model, ...) as a plain dict: ESPnet3 202611's contract.

``EnvironmentProvider.build_env_local()`` builds the env in this process; ``build_worker_setup_fn()``
is called on the driver and returns a picklable no-argument function that builds the env on a worker
(it must not capture the provider itself). ``InferenceProvider`` builds
``{"dataset": ..., "model": ..., **params}`` for ``config.test_set``, after ``config.update(params)``.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from espnet3_prefect.config.targets import instantiate
from espnet3_prefect.errors import ConfigError

_MODEL_BUILD_LOCK = threading.RLock()


class EnvironmentProvider:
    """Base class: implement :meth:`build_env_local` (and :meth:`build_worker_setup_fn` when the
    worker build differs; by default a worker builds the env the local way).

    >>> class Const(EnvironmentProvider):
    ...     def build_env_local(self): return {"k": 1}
    >>> Const({}).build_worker_setup_fn()()
    {'k': 1}
    """

    def __init__(self, config: Any):
        self.config = config

    def build_env_local(self) -> dict[str, Any]:
        """The env for this process: a plain dict of named entries injected into ``forward``."""
        raise NotImplementedError(f"{type(self).__qualname__} must implement build_env_local()")

    def build_worker_setup_fn(self) -> Callable[[], dict[str, Any]]:
        """A picklable no-argument function that builds the env on a worker."""
        return _BuildLocal(self)


class _BuildLocal:
    def __init__(self, provider: EnvironmentProvider):
        self.provider = provider

    def __call__(self) -> dict[str, Any]:
        return self.provider.build_env_local()


class InferenceProvider(EnvironmentProvider):
    """Builds ``dataset`` and ``model`` for ``config.test_set``, plus ``params``.

    Override the static :meth:`build_dataset` / :meth:`build_model` for recipe-specific logic.
    """

    def __init__(self, inference_config: Any = None, params: dict[str, Any] | None = None):
        super().__init__(inference_config)
        self.params = params or {}
        self.config.update(self.params)

    def build_env_local(self) -> dict[str, Any]:
        env = {"dataset": self.build_dataset(self.config), "model": self.build_model(self.config)}
        env.update(self.params)
        return env

    def build_worker_setup_fn(self) -> Callable[[], dict[str, Any]]:
        """A function over the class, the config and a copy of the params (never ``self``)."""
        return _InferenceSetup(type(self), self.config, dict(self.params))

    @staticmethod
    def build_dataset(config: DictConfig) -> Any:
        """Instantiate ``config.dataset`` (a data organizer) and return its ``test[config.test_set]``."""
        if isinstance(config, dict):
            config = OmegaConf.create(config)
        if OmegaConf.select(config, "dataset._target_") is None:
            raise ConfigError("dataset._target_: missing; name a data organizer class or override build_dataset()")
        organizer = instantiate(config.dataset)
        try:
            return organizer.test[config.test_set]
        except (KeyError, AttributeError, TypeError):
            raise ConfigError(f"dataset: the organizer has no test set {config.test_set!r}") from None

    @staticmethod
    def build_model(config: DictConfig) -> Any:
        """Instantiate ``config.model`` with ``device=`` this worker's device (:func:`resolve_device`),
        inside ``recipe_dir`` when set (relative paths in ``model`` resolve against it)."""
        if isinstance(config, dict):
            config = OmegaConf.create(config)
        if OmegaConf.select(config, "model._target_") is None:
            raise ConfigError("model._target_: missing; name a model class or override build_model()")
        device = resolve_device(config)
        recipe_dir = OmegaConf.select(config, "recipe_dir")
        with _MODEL_BUILD_LOCK:
            if not recipe_dir:
                return instantiate(config.model, device=device)
            with _inside(str(recipe_dir)):
                model = instantiate(config.model, device=device)
                _absolute_file_attributes(model)
                return model


class _InferenceSetup:
    """The worker setup function of :class:`InferenceProvider` (a class, so it pickles by reference)."""

    def __init__(self, cls: type, config: Any, params: dict):
        self.cls, self.config, self.params = cls, config, params

    def __call__(self) -> dict[str, Any]:
        env = {"dataset": self.cls.build_dataset(self.config), "model": self.cls.build_model(self.config)}
        env.update(self.params)
        return env


@contextlib.contextmanager
def _inside(directory: str) -> Iterator[None]:
    """chdir into ``directory`` with relative ``sys.path`` entries set aside (so its files shadow nothing)."""
    if not Path(directory).is_dir():
        raise ConfigError(f"recipe_dir: {directory} is not a folder")
    cwd = os.getcwd()
    relative = [(i, p) for i, p in enumerate(sys.path) if not os.path.isabs(p)]
    sys.path[:] = [p for p in sys.path if os.path.isabs(p)]
    os.chdir(directory)
    try:
        yield
    finally:
        os.chdir(cwd)
        for index, entry in relative:
            sys.path.insert(min(index, len(sys.path)), entry)


def _absolute_file_attributes(obj: Any, seen: set | None = None) -> None:
    """Rewrite string attributes naming an existing file relative to the cwd (``recipe_dir`` while the
    model is built) as absolute paths, through nested objects, dicts, lists and tuples, so a model that
    opens its files later, from another folder, still finds them."""
    seen = set() if seen is None else seen
    if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type(None))):
        return
    seen.add(id(obj))
    if isinstance(obj, dict):
        children = list(obj.values())
    elif isinstance(obj, (list, tuple)):
        children = list(obj)
    else:
        attrs = getattr(obj, "__dict__", None) or {}
        for name, value in list(attrs.items()):
            if isinstance(value, str) and value and not os.path.isabs(value) and os.path.isfile(value):
                with contextlib.suppress(AttributeError, TypeError):
                    setattr(obj, name, os.path.abspath(value))
        children = [v for v in attrs.values() if not isinstance(v, str)]
    for child in children:
        _absolute_file_attributes(child, seen)


def resolve_device(config: Any = None) -> str:
    """The torch device for this worker, in ESPnet3 202611's order.

    ``config.device`` when set (``auto`` counts as unset); else ``cpu`` without CUDA; else the
    logical index ``config.device_index``, ``config.local_rank`` or ``$LOCAL_RANK`` (an index beyond
    the GPUs this process sees is an error); else ``cuda:0`` (dask-cuda gives each worker its GPU first).

    >>> resolve_device({"device": "cpu"})
    'cpu'
    """
    get = (
        (lambda k: OmegaConf.select(config, k)) if isinstance(config, DictConfig) else (lambda k: (config or {}).get(k))
    )
    device = get("device")
    if device not in (None, "", "auto"):
        return str(device)
    count = _cuda_device_count()
    if count == 0:
        return "cpu"
    index = next(
        (v for v in (get("device_index"), get("local_rank"), os.environ.get("LOCAL_RANK")) if v not in (None, "")), None
    )
    if index is None:
        return "cuda:0"
    if not 0 <= int(index) < count:
        raise ConfigError(
            f"device_index: CUDA device {index} does not exist for this process "
            f"({count} visible GPU(s)); check CUDA_VISIBLE_DEVICES / LOCAL_RANK"
        )
    return f"cuda:{int(index)}"


def _cuda_device_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
