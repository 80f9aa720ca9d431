"""The provider's ``params`` of one test set, named and valued as ESPnet3 202611's ``infer()`` sets them
(``input_key``, ``idx_key``, ``output_keys``, ``inference_contract`` (+ ``inference_contract_root``),
``output_fn_path``, ``output_artifacts``), and the ``contract:`` block they carry, each checked on the
driver before anything starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from espnet3_prefect.config.targets import load_callable
from espnet3_prefect.errors import ConfigError, one_line
from espnet3_prefect.espnet3.contract import load_inference_contract
from espnet3_prefect.espnet3.inference_runner import key_list


def load_contract(cfg: DictConfig) -> Any:
    """The ``contract:`` block, loaded now so a bad one fails before anything starts."""
    raw = cfg.get("contract")
    if raw is None:
        return None
    try:
        contract = load_inference_contract(raw)
    except ConfigError:
        raise
    except Exception as exc:  # upstream's loader raises TypeError/ValueError/ImportError
        raise ConfigError(f"contract: {type(exc).__name__}: {one_line(exc)}") from None
    if cfg.get("output_fn"):
        raise ConfigError("output_fn: cannot be combined with contract: (drop one of them)")
    contract.validate_input_keys(_input_key(cfg))
    return contract


def _input_key(cfg: DictConfig) -> Any:
    input_key = cfg.get("input_key")
    if input_key is None or input_key == "" or (not isinstance(input_key, str) and len(input_key) == 0):
        raise ConfigError("input_key: missing or empty; name the dataset field(s) the model reads")
    return input_key if isinstance(input_key, str) else list(input_key)


def _output_keys(cfg: DictConfig) -> list[str] | None:
    if cfg.get("output_keys") is None:
        return None
    keys = key_list(cfg.output_keys)
    if not keys:
        raise ConfigError("output_keys: empty list; omit it to write every output field")
    return keys


def stage_params(cfg: DictConfig, contract: Any = None) -> dict[str, Any]:
    """Provider params exactly as ESPnet3 202611's ``infer()`` builds them."""
    raw = OmegaConf.select(cfg, "provider.params")
    params = OmegaConf.to_container(raw, resolve=True) if raw is not None else {}
    if not isinstance(params, dict):
        raise ConfigError("provider.params: must be a mapping")
    added: dict[str, Any] = {
        "input_key": _input_key(cfg),
        "idx_key": cfg.get("idx_key", "utt_id"),
        "output_keys": _output_keys(cfg),
    }
    if contract is not None:
        added["inference_contract"] = OmegaConf.to_container(cfg.contract, resolve=True)
        if getattr(contract, "imports", ()):
            added["inference_contract_root"] = str(Path(cfg.get("recipe_dir") or ".").resolve())
    if cfg.get("output_fn"):
        load_callable(cfg.output_fn, "output_fn")  # fail now, not on a worker
        added["output_fn_path"] = cfg.output_fn
    artifacts = cfg.get("output_artifacts") or {}
    added["output_artifacts"] = (
        OmegaConf.to_container(artifacts, resolve=True) if OmegaConf.is_config(artifacts) else dict(artifacts)
    )
    clash = sorted(set(added) & set(params))
    if clash:
        raise ConfigError(f"provider.params.{clash[0]}: also set by the stage from the top-level config; keep one")
    return {**params, **added}
