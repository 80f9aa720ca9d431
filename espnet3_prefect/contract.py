"""PLACEHOLDER (lead): replaced by the `contract` helper's module at merge time."""
from __future__ import annotations

import importlib.util

from .errors import ConfigError

_UPSTREAM = importlib.util.find_spec("espnet3") is not None


def load_inference_contract(config):
    if config is None:
        return None
    if _UPSTREAM:
        from espnet3.contract.inference import load_inference_contract as up
        return up(config)
    raise ConfigError("contract: not supported without espnet3 yet")


def resolve_inference_contract(contract, root=None):
    if contract is None:
        return None
    if _UPSTREAM:
        from espnet3.contract.inference import resolve_inference_contract as up
        return up(contract, root)
    raise ConfigError("contract: not supported without espnet3 yet")


def prepare_inference_inputs(dataset, idx, contract, model):
    from espnet3.contract.inference import prepare_inference_inputs as up
    return up(dataset, idx, contract, model)


def validate_inference_outputs(result, idx, contract, model, original, idx_key):
    from espnet3.contract.inference import validate_inference_outputs as up
    return up(result, idx, contract, model, original, idx_key)
