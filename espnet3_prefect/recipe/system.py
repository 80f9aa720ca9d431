"""A system's stages as ESPnet3 declares them, read off a built system: order, config roles, folders.

ESPnet3 202611's contract (``espnet3.contract.stages``): a system class holds ``stages``, a tuple of
``StageSpec(name, config, log_dir)`` in the order ``--stages all`` runs them; ``config`` is a role
(``"training"``) or a tuple of them, the first whose ``<role>_config`` is set on the system is the
stage's; ``log_dir`` is a dotted key of that config naming the stage's folder (its ``<stage>.log``),
and a stage without one (or whose key is unset) logs to the system's ``_default_log_dir``.

>>> from types import SimpleNamespace as NS
>>> from omegaconf import OmegaConf
>>> class Toy:
...     stages = (NS(name="create_dataset", config="training", log_dir="data_dir"),
...               NS(name="pack_model", config=("publication", "training"), log_dir=None))
...     training_config = OmegaConf.create({"data_dir": "data"})
...     publication_config = None
...     _default_log_dir = Path("exp")
>>> stage_names(Toy()), log_dir_of(Toy(), "create_dataset"), log_dir_of(Toy(), "pack_model")
(['create_dataset', 'pack_model'], PosixPath('data'), PosixPath('exp'))
>>> role_of(Toy(), "pack_model")
'training'
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from espnet3_prefect.errors import ConfigError


def specs(system: Any) -> tuple:
    """The system's declared stages, in ESPnet3's order."""
    return tuple(getattr(type(system), "stages", None) or getattr(system, "stages", ()))


def stage_names(system: Any) -> list[str]:
    return [spec.name for spec in specs(system)]


def spec_of(system: Any, stage: str):
    for spec in specs(system):
        if spec.name == stage:
            return spec
    raise ConfigError(f"--stages: {type(system).__name__} has no stage {stage!r}; it has {stage_names(system)}")


def _roles(spec) -> tuple[str, ...]:
    return (spec.config,) if isinstance(spec.config, str) else tuple(spec.config)


def role_of(system: Any, stage: str) -> str | None:
    """The config role the stage reads: the first of its roles whose config the system has."""
    for role in _roles(spec_of(system, stage)):
        if getattr(system, f"{role}_config", None) is not None:
            return role
    return None


def config_of(system: Any, role: str | None) -> Any:
    return getattr(system, f"{role}_config", None) if role else None


def folder(system: Any, stage: str, key: str | None) -> Path | None:
    """The folder the dotted ``key`` of the stage's config names, or None where it is unset."""
    config = config_of(system, role_of(system, stage))
    if config is None or not key:
        return None
    value = OmegaConf.select(config, key)
    return Path(str(value)) if value not in (None, "") else None


def log_dir_of(system: Any, stage: str) -> Path:
    """Where ESPnet3 writes ``<stage>.log``: the stage's ``log_dir`` key, else the default folder."""
    found = folder(system, stage, spec_of(system, stage).log_dir)
    return found if found is not None else Path(system._default_log_dir)


__all__ = ["config_of", "folder", "log_dir_of", "role_of", "spec_of", "specs", "stage_names"]
