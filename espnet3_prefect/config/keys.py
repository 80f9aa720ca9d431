"""Top-level config keys: a misspelt one fails on one line instead of being silently ignored.

A config may carry keys of its own (``fsdd_root``, ``lm_path``: a user's provider or an
interpolation reads them), so an unknown key alone is not an error. One that is unknown *and* within
one or two edits of a key ESPnet3 202611 or espnet3-prefect reads (``batch_sise``, ``inferece_dir``,
``paralel``) is almost always a typo whose value would be dropped without a word: that fails, naming
the key and the likely one. A deliberate near-miss is kept by listing it under ``allow_keys:``
(a top-level list in the same config, so it travels with it to the CLI, ``infer()`` and deployments).

>>> check_top_level_keys({"batch_size": 4, "fsdd_root": "/data"}, INFERENCE_KEYS)
>>> check_top_level_keys({"batch_sise": 4}, INFERENCE_KEYS)  # doctest: +NORMALIZE_WHITESPACE
Traceback (most recent call last):
...
espnet3_prefect.errors.ConfigError: batch_sise: not a config key; did you mean batch_size? (a key of your own: list it
under allow_keys:)
>>> check_top_level_keys({"batch_sise": 4, "allow_keys": ["batch_sise"]}, INFERENCE_KEYS)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from espnet3_prefect.errors import ConfigError

#: the config list that names deliberate near-miss keys
ALLOW_KEY = "allow_keys"

# What ESPnet3 202611's launcher, infer() and measure() read at the top level of a stage config
# (its TEMPLATE conf/*.yaml and systems/base), and what the training config lends them.
_ESPNET3_KEYS = frozenset(
    {
        "recipe_dir",
        "exp_tag",
        "exp_dir",
        "data_dir",
        "stats_dir",
        "inference_dir",
        "dataset",
        "parallel",
        "model",
        "input_key",
        "idx_key",
        "output_keys",
        "output_fn",
        "output_artifacts",
        "batch_size",
        "contract",
        "provider",
        "runner",
        "test_set",
        "device",
        "device_index",
        "local_rank",
        "seed",
        "metrics",
        "dataset_artifacts",
        "task",
        "system",
        "trainer",
        "optim",
        "scheduler",
        "dataloader",
        "tokenizer",
        "create_dataset",
        "decode_dir",
        "publication",
        "upload_model",
        "pack_model",
        "num_device",
        "num_nodes",
    }
)
# What espnet3-prefect adds (the demo's data and features; the model id evaluate adds to infer's config).
_OUR_KEYS = frozenset({ALLOW_KEY, "data", "features", "evaluate_model_id"})

INFERENCE_KEYS = _ESPNET3_KEYS | _OUR_KEYS
METRICS_KEYS = INFERENCE_KEYS


def edit_distance(a: str, b: str, limit: int = 2) -> int:
    """Optimal string alignment distance (insert, delete, substitute, swap two neighbours), capped
    at ``limit + 1``.

    >>> edit_distance("paralel", "parallel"), edit_distance("batch_sise", "batch_size"), edit_distance("ab", "ba")
    (1, 1, 1)
    """
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2: list[int] = []
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        row = [i] + [0] * len(b)
        for j, cb in enumerate(b, 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (ca != cb))
            if i > 1 and j > 1 and ca == b[j - 2] and a[i - 2] == cb:
                row[j] = min(row[j], prev2[j - 2] + 1)
        prev2, prev = prev, row
    return min(prev[-1], limit + 1)


def likely_key(key: str, known: Iterable[str]) -> str | None:
    """The known key ``key`` is most likely a typo of: one edit away for short keys (up to 5
    characters), up to two for longer ones; None when none is that close."""
    limit = 1 if len(key) <= 5 else 2
    best = min(((edit_distance(key, k, limit), k) for k in known if k != key), default=(limit + 1, None))
    return best[1] if best[0] <= limit else None


def check_top_level_keys(config: Mapping[str, Any], known: Iterable[str] = INFERENCE_KEYS) -> None:
    """Raise :class:`ConfigError` for the first top-level key of ``config`` that is unknown, not
    listed under ``allow_keys:``, and close to a known key."""
    known = frozenset(known)
    allowed = config.get(ALLOW_KEY) or []
    if isinstance(allowed, str) or not all(isinstance(k, str) for k in allowed):
        raise ConfigError(f"{ALLOW_KEY}: must be a list of top-level key names, got {allowed!r}")
    for key in config:
        if not isinstance(key, str) or key in known or key in allowed:
            continue
        close = likely_key(key, known)
        if close is not None:
            raise ConfigError(
                f"{key}: not a config key; did you mean {close}? (a key of your own: list it under {ALLOW_KEY}:)"
            )


__all__ = ["ALLOW_KEY", "INFERENCE_KEYS", "METRICS_KEYS", "check_top_level_keys", "edit_distance", "likely_key"]
