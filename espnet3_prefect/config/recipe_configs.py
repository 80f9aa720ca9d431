"""An ESPnet3 recipe's configs loaded as its launcher loads them, for ``espnet3-prefect infer/metrics``.

Inside a recipe folder laid out as ESPnet3's (``conf/<file>.yaml``, the folder named after its system,
e.g. ``egs3/mini_an4/esp2_asr``) with espnet3 installed, ``espnet3-prefect infer --config
conf/inference_parallel.yaml`` loads the file the way ``python run.py --stages infer ...`` would, with
ESPnet3's own loader: the system's ``egs3.TEMPLATE.<system>/conf/inference.yaml`` merged under it,
``${self_name:}`` the file's stem (``inference_dir: ${exp_dir}/${self_name:}``), relative resolver
paths from the file's folder; further files merge on top (e.g. ``deployments/parallel_slurm.yaml``);
then, as the launcher does, ``exp_tag``/``exp_dir`` are copied from ``--training-config`` (and, for
``metrics``, ``inference_dir`` from ``--inference-config``, its own overrides applied first); the
command line's ``key=value`` overrides apply last. The result is resolved and goes to the flow as one
mapping. Outside a recipe, or without espnet3, configs load as before
(:func:`espnet3_prefect.config.load.load_config`).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from espnet3_prefect.config.load import apply_override, read_yaml, resolved
from espnet3_prefect.errors import ConfigError, one_line

logger = logging.getLogger("espnet3_prefect")


def template_package(config_file: str | Path, system: str | None = None) -> str | None:
    """The ``egs3.TEMPLATE`` package whose ``conf/`` defaults ESPnet3's launcher merges under this file:
    from ``system`` (a class path, ``--system``) or the recipe folder's name (``conf/..`` of the file);
    None when espnet3 is not installed or the recipe has no TEMPLATE (then no recipe loading)."""
    if importlib.util.find_spec("espnet3") is None:
        if system:
            raise ConfigError(f'--system: {system} needs espnet3 installed (pip install "espnet[asr]==202611")')
        return None
    if system:
        name = system_from_path(system).__module__.split(".")[-2]
    else:
        name = Path(config_file).resolve().parent.parent.name
    package = f"egs3.TEMPLATE.{name}"
    try:
        found = importlib.util.find_spec(package) is not None and (resources.files(package) / "conf").is_dir()
    except (ImportError, ValueError):
        found = False
    if not found and system:
        raise ConfigError(f"--system: {system} has no TEMPLATE configs ({package}.conf not installed)")
    return package if found else None


def load_recipe_configs(
    role: str,
    files: Sequence[str],
    overrides: Sequence[str],
    package: str,
    *,
    training: Sequence[str] = (),
    inference: Sequence[str] = (),
    inference_overrides: Sequence[str] = (),
) -> dict[str, dict]:
    """``{role: config}`` for ``role`` (``inference`` or ``metrics``) and, for ``metrics``, the inference
    config it reads: each a resolved plain mapping, loaded as the launcher loads it (module docstring),
    then its ``key=value`` overrides. ``training``: the training config's files, for ``exp_tag``/``exp_dir``."""
    if not files:
        raise ConfigError(f"no config file given: pass --config conf/{role}.yaml")
    load_and_merge, copy_context, validate = _espnet3_loader()
    loaded = {
        name: _load_role(load_and_merge, name, paths, package) if paths else None
        for name, paths in (("training", training), ("inference", inference), (role, files))
    }
    if role != "inference":
        for item in inference_overrides:  # before the context is copied: its inference_dir reaches metrics
            apply_override(loaded["inference"], item)
    copy_context(
        training_config=loaded["training"],
        inference_config=loaded.get("inference"),
        metrics_config=loaded.get("metrics"),
        publication_config=None,
        log=logger,
    )
    try:
        validate(
            training_config=loaded["training"],
            inference_config=loaded.get("inference"),
            metrics_config=loaded.get("metrics"),
            stages_to_run=["infer" if role == "inference" else "measure"],
        )
    except ValueError as exc:
        raise ConfigError(
            f"{one_line(exc)} (here: pass --training-config conf/training.yaml, whose exp_tag and "
            f"exp_dir ESPnet3's launcher copies, or set exp_tag)"
        ) from None
    for item in overrides:  # last: what the user says on the command line wins
        apply_override(loaded[role], item)
    return {
        name: OmegaConf.to_container(resolved(loaded[name]), resolve=True)
        for name in dict.fromkeys((role, "inference"))
        if loaded.get(name) is not None
    }


def _load_role(load_and_merge, role: str, paths: Sequence[str], package: str) -> DictConfig:
    """The first file with the TEMPLATE under it (ESPnet3's loader), then any further files on top."""
    first = Path(paths[0])
    if not first.is_file():
        raise ConfigError(f"config file not found: {first}")
    try:
        cfg = load_and_merge(first, config_name=f"{role}.yaml", default_package=package, resolve=False)
    except Exception as exc:  # noqa: BLE001 - ESPnet3's loader: yaml, missing files, defaults lists
        raise ConfigError(f"{first}: ESPnet3's loader failed: {one_line(exc)}") from None
    for path in paths[1:]:
        cfg = OmegaConf.merge(cfg, read_yaml(Path(path)))
    return cfg


def _espnet3_loader():
    try:
        config_utils = importlib.import_module("espnet3.utils.config_utils")
        run_utils = importlib.import_module("espnet3.utils.run_utils")
        return (
            config_utils.load_and_merge_config,
            run_utils.apply_training_experiment_context,
            run_utils.validate_experiment_context,
        )
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"recipe configs need ESPnet3 202611's loader: {one_line(exc)}") from None


__all__ = ["load_recipe_configs", "template_package"]


def system_from_path(path: str) -> type:
    """``--system``: a dotted ``module.Class`` path (the recipe folder is importable from the CLI)."""
    module_name, _, name = path.rpartition(".")
    if not module_name:
        raise ConfigError(f"--system: {path!r} is not a dotted path like espnet3.systems.esp2_asr.system.ASRSystem")
    try:
        found = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"--system: cannot import {path!r}: {exc}") from None
    if not isinstance(found, type):
        raise ConfigError(f"--system: {path!r} is not a class")
    return found
