"""What the command line and ``infer()`` check on the driver before a server starts, beyond the config
itself: the recipe's data made on demand (the DTMF demo's audio on a fresh clone), then each test set's
dataset built once and its input keys checked (:func:`espnet3_prefect.pipeline.sizing.checked_dataset`).
A typo in ``input_key`` is then the one line a user sees, with no server start before it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from omegaconf import DictConfig, OmegaConf

from espnet3_prefect.config.vocoder import check_vocoder
from espnet3_prefect.pipeline.dataprep import ensure_prepared
from espnet3_prefect.pipeline.sizing import checked_dataset, require_lengths

log = logging.getLogger("espnet3_prefect")


def check_inputs_before_start(
    cfg: DictConfig, stages: Iterable, dataset_of: Callable[[Any], Any] = checked_dataset
) -> None:
    """The model's own files first (F5-TTS's vocoder, :func:`~espnet3_prefect.config.vocoder.check_vocoder`),
    then make the recipe's data when it has a hook for it, then check every test set's inputs.
    ``dataset_of(stage)``: the test set's dataset, built and checked (a run plan builds it once)."""
    model = cfg.get("model")
    plain_model = OmegaConf.to_container(model, resolve=True) if OmegaConf.is_config(model) else model
    check_vocoder({"model": plain_model, "recipe_dir": cfg.get("recipe_dir")})
    for made in ensure_prepared(cfg):
        log.info("prepared data: %s", made)
    for stage in stages:
        dataset = dataset_of(stage)
        if dataset is not None:
            require_lengths(stage, dataset)


__all__ = ["check_inputs_before_start"]
