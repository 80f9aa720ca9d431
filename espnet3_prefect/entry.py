"""Drop-in Python entry points with ESPnet3 202611's signatures: a recipe's ``run.py`` switches its
infer and measure stages to Prefect by changing one import::

    from espnet3_prefect import infer, measure    # was: from espnet3.systems.base.inference import infer
                                                   #      from espnet3.systems.base.metric import measure
    infer(inference_config)                        # a flow run (a subflow inside a running flow)
    results = measure(metrics_config, inference_config=inference_config)

Without ``PREFECT_API_URL`` they start the embedded Prefect server (127.0.0.1) for the call.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf


def _plain(config: Any) -> dict:
    if isinstance(config, DictConfig):
        return OmegaConf.to_container(config, resolve=True)
    return dict(config)


def _importable_cwd() -> None:
    """Recipe modules (``src.inference.MyProvider``) import on workers, also in batch jobs."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if cwd not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([cwd, *parts])


def infer(config: DictConfig) -> None:
    """Run inference over every test set of ``config`` and write ``<inference_dir>/<test>/<field>.scp``,
    as ``espnet3.systems.base.inference.infer`` does, as the Prefect flow ``infer``."""
    from .config import load_config_input
    from .server import prefect_api
    from .stage import prepare_stages

    plain = _plain(config)
    prepare_stages(load_config_input(plain))  # every config error before a server or cluster starts
    _importable_cwd()
    with prefect_api():
        from .flows.infer import infer as infer_flow

        infer_flow(config=plain)


def measure(metrics_config: DictConfig, inference_config: DictConfig | None = None) -> dict:
    """Score every test set and write ``<inference_dir>/metrics.json``, as
    ``espnet3.systems.base.metric.measure`` does; returns ``{metric class path: {test set: result}}``."""
    from .server import prefect_api

    _importable_cwd()
    with prefect_api():
        from .flows.metrics import metrics as metrics_flow

        return metrics_flow(config=_plain(metrics_config),
                            inference_config=None if inference_config is None else _plain(inference_config))
