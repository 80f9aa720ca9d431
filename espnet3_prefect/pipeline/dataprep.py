"""Data a recipe can make on demand: the dataset class's ``ensure_prepared(test=[...])`` hook.

A deployment runs from a fresh clone; the DTMF demo generates its audio there the first time
(``DTMFOrganizer.ensure_prepared``) instead of needing a separate setup step. Recipes without
the hook are untouched.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from espnet3_prefect.config.targets import locate


def ensure_prepared(cfg: DictConfig) -> list[str]:
    """Call ``dataset._target_``'s ``ensure_prepared(test=...)`` when it has one; return what it made."""
    target = OmegaConf.select(cfg, "dataset._target_")
    tests = OmegaConf.select(cfg, "dataset.test")
    if not target or tests is None:
        return []
    hook = getattr(locate(target, "dataset._target_"), "ensure_prepared", None)
    if not callable(hook):
        return []
    return [str(p) for p in hook(test=OmegaConf.to_container(tests, resolve=True)) or []]
