"""``_target_`` resolution: ESPnet3's stock class paths resolve to ours when espnet3 is absent.

So an ESPnet3 recipe's ``inference.yaml`` runs unchanged. With espnet3 installed, its own classes
are used.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from hydra.utils import instantiate as _hydra_instantiate
from omegaconf import DictConfig, ListConfig, OmegaConf

from espnet3_prefect.errors import ConfigError, one_line

ESPNET3_ALIASES = {
    "espnet3.parallel.env_provider.EnvironmentProvider": "espnet3_prefect.espnet3.provider.EnvironmentProvider",
    "espnet3.parallel.inference_provider.InferenceProvider": "espnet3_prefect.espnet3.provider.InferenceProvider",
    "espnet3.systems.base.inference_provider.InferenceProvider": "espnet3_prefect.espnet3.provider.InferenceProvider",
    "espnet3.parallel.base_runner.BaseRunner": "espnet3_prefect.espnet3.runner.BaseRunner",
    "espnet3.systems.base.inference_runner.InferenceRunner": "espnet3_prefect.espnet3.inference_runner.InferenceRunner",
    "espnet3.systems.esp2_asr.metrics.wer.WER": "espnet3_prefect.metrics.WER",
    "espnet3.systems.esp2_asr.metrics.cer.CER": "espnet3_prefect.metrics.CER",
}


def espnet3_installed() -> bool:
    """Whether ``espnet3`` can be imported."""
    try:
        importlib.import_module("espnet3")
    except ImportError:
        return False
    return True


def resolve_target(path: str) -> str:
    """The class path to import for ``path``: ours for ESPnet3 stock classes when espnet3 is absent.

    >>> stock = "espnet3.systems.base.inference_runner.InferenceRunner"
    >>> ours = "espnet3_prefect.espnet3.inference_runner.InferenceRunner"
    >>> resolve_target(stock) == (stock if espnet3_installed() else ours)
    True
    >>> resolve_target("my_recipe.src.Runner")
    'my_recipe.src.Runner'
    """
    if path in ESPNET3_ALIASES and not espnet3_installed():
        return ESPNET3_ALIASES[path]
    return path


def locate(path: str, key: str = "_target_") -> Any:
    """Import a dotted ``module.attr`` path; errors name the config key and the path."""
    if not isinstance(path, str) or "." not in path:
        raise ConfigError(f"{key}: {path!r} is not a dotted path like package.module.Name")
    path = resolve_target(path)
    module_name, _, attr = path.rpartition(".")
    obj = None
    while module_name:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name and not module_name.startswith(exc.name) and exc.name != module_name:
                raise ConfigError(f"{key}: importing {path!r} failed: {one_line(exc)}") from None
            module_name, _, parent = module_name.rpartition(".")
            attr = f"{parent}.{attr}"
            continue
        obj = module
        break
    if obj is None:
        if path.startswith("espnet3.") and not espnet3_installed():
            close = difflib.get_close_matches(path, list(ESPNET3_ALIASES), n=1, cutoff=0.8)
            hint = (
                f"did you mean {close[0]!r}?"
                if close
                else f"the ones it provides: {', '.join(sorted(ESPNET3_ALIASES))}"
            )
            raise ConfigError(
                f"{key}: {path!r} is not an ESPnet3 class espnet3-prefect provides while espnet3 "
                f"is not installed; {hint}"
            )
        raise ConfigError(f"{key}: cannot import {path!r} (is its package installed and on PYTHONPATH?)")
    for part in attr.split("."):
        if not hasattr(obj, part):
            close = difflib.get_close_matches(part, [n for n in dir(obj) if not n.startswith("_")], n=1, cutoff=0.8)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{key}: {path!r} has no attribute {part!r}{hint}")
        obj = getattr(obj, part)
    return obj


def _rewrite(node: Any) -> Any:
    if isinstance(node, (DictConfig, dict)):
        out = {k: _rewrite(v) for k, v in node.items()}
        if isinstance(out.get("_target_"), str):
            out["_target_"] = resolve_target(out["_target_"])
        return out
    if isinstance(node, (ListConfig, list)):
        return [_rewrite(v) for v in node]
    return node


def instantiate(node: Any, **kwargs: Any) -> Any:
    """Hydra ``instantiate`` with ESPnet3 aliases applied; errors name the ``_target_``."""
    plain = OmegaConf.to_container(node, resolve=True) if isinstance(node, (DictConfig, ListConfig)) else node
    target = plain.get("_target_") if isinstance(plain, dict) else None
    if target is not None:
        locate(target)  # a clear error for a bad path before Hydra's long one
    try:
        return _hydra_instantiate(OmegaConf.create(_rewrite(plain)), **kwargs)
    except ConfigError:
        raise
    except Exception as exc:  # Hydra wraps the cause; keep ours one line
        cause = exc.__cause__ or exc
        raise ConfigError(f"_target_ {target!r}: instantiation failed: {one_line(cause)}") from exc


def load_callable(path: Any, key: str) -> Any:
    """A callable given as a dotted path (or already a callable); errors name ``key``."""
    if callable(path):
        return path
    obj = locate(path, key)
    if not callable(obj):
        raise ConfigError(f"{key}: {path!r} is not callable")
    return obj
