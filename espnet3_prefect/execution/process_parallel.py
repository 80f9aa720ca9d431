"""The process-wide ``parallel`` block: ``set_parallel`` / ``get_parallel_config`` with ESPnet3 202611's
semantics, so ``runner(indices)`` knows whether to run in this process or as a Prefect flow on Dask.

* ``set_parallel(cfg)`` registers ``cfg`` (a DictConfig or a plain mapping), validated the way every
  ``parallel`` block is (:meth:`ParallelSpec.from_config`), so a bad block fails here on one line.
* ``set_parallel(None)`` keeps a block already registered, else registers the default
  ``{env: local, n_workers: 1, options: {}}`` (as upstream does: after it, runners use the flow).
* ``get_parallel_config()`` returns the registered block (a DictConfig whose ``options`` is a plain
  dict), or None when nothing was registered: then ``runner(indices)`` runs in this process.

>>> from omegaconf import OmegaConf
>>> set_parallel(OmegaConf.create({"env": "local", "n_workers": 2}))
>>> cfg = get_parallel_config(); (cfg.env, cfg.n_workers, cfg.options)
('local', 2, {})
>>> set_parallel({"env": "slrum"})  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
espnet3_prefect.errors.ConfigError: parallel.env: unknown backend 'slrum'; valid values: local, local_gpu, slurm, pbs,
sge, lsf, htcondor, moab, oar, ssh, kube
>>> _reset()
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution.spec import ParallelSpec

DEFAULT_PARALLEL = {"env": "local", "n_workers": 1, "options": {}}

_registered: DictConfig | None = None


def plain_parallel(config: Any) -> dict | None:
    """A ``parallel`` block (DictConfig, mapping or None) as a plain dict with interpolations resolved."""
    if config is None:
        return None
    if isinstance(config, DictConfig):
        return OmegaConf.to_container(config, resolve=True)
    if isinstance(config, Mapping):
        return OmegaConf.to_container(OmegaConf.create(dict(config)), resolve=True)
    raise ConfigError(f"parallel: must be a mapping (env, n_workers, options), got {type(config).__name__}")


def set_parallel(config: DictConfig | Mapping | None) -> None:
    """Register the ``parallel`` block every later ``runner(indices)`` in this process uses."""
    global _registered
    if config is None:
        if _registered is not None:
            return
        config = DEFAULT_PARALLEL
    block = plain_parallel(config)
    ParallelSpec.from_config(block)  # raises ConfigError naming the bad key
    block["options"] = dict(block.get("options") or {})
    _registered = OmegaConf.create(block)


def get_parallel_config() -> DictConfig | None:
    """The block :func:`set_parallel` registered, or None."""
    return _registered


def active_parallel_config() -> DictConfig | None:
    """What ``runner(indices)`` dispatches on: ours, else one registered with upstream's
    ``espnet3.parallel.parallel.set_parallel`` when that module is loaded (a recipe that kept
    upstream's ``set_parallel`` import but switched its runner classes to ours)."""
    if _registered is not None:
        return _registered
    upstream = sys.modules.get("espnet3.parallel.parallel")
    return getattr(upstream, "parallel_config", None) if upstream is not None else None


def _reset() -> None:
    """Forget the registered block (tests)."""
    global _registered
    _registered = None
