"""The ``runner:`` keys that steer the orchestration (retries, ``on_error``, free space, prefetch,
``max_duration``: batches by duration, see :mod:`espnet3_prefect.pipeline.duration`), never passed
to the runner's constructor, and ``batch_size``: their defaults and checks. Moved out of ``stage.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from espnet3_prefect.errors import ConfigError

# runner keys that steer the orchestration: ours, never passed to the runner's constructor
RUNNER_CONTROL_KEYS = (
    "retries",
    "retry_delay_s",
    "on_error",
    "max_failed_ratio",
    "min_free_mb",
    "prefetch",
    "max_duration",
)
ON_ERROR = ("fail", "skip")
DEFAULT_MAX_FAILED_RATIO = 0.05
DEFAULT_MIN_FREE_MB = 100.0
DEFAULT_RETRIES = 2
DEFAULT_RETRY_DELAY_S = (2.0, 10.0)

#: units (batches, or items when batch_size is null) read ahead of the one forward works on
DEFAULT_PREFETCH = 2


def runner_control(block: DictConfig) -> dict:
    """The ``runner:`` keys that steer the run (retries, on_error, ...), checked, with their defaults."""
    retries = block.get("retries", DEFAULT_RETRIES)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ConfigError(f"runner.retries: must be an integer >= 0, got {retries!r}")
    delay = block.get("retry_delay_s", list(DEFAULT_RETRY_DELAY_S))
    delay = [delay] if isinstance(delay, (int, float)) else list(delay)
    if not delay or any(isinstance(d, bool) or not isinstance(d, (int, float)) or d < 0 for d in delay):
        raise ConfigError(f"runner.retry_delay_s: must be a number or list of numbers >= 0, got {delay!r}")
    on_error = block.get("on_error", "fail")
    if on_error not in ON_ERROR:
        raise ConfigError(f"runner.on_error: {on_error!r} is not one of: {', '.join(ON_ERROR)}")
    ratio = block.get("max_failed_ratio", DEFAULT_MAX_FAILED_RATIO)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
        raise ConfigError(f"runner.max_failed_ratio: must be a number from 0 to 1, got {ratio!r}")
    free = block.get("min_free_mb", DEFAULT_MIN_FREE_MB)
    if isinstance(free, bool) or not isinstance(free, (int, float)) or free < 0:
        raise ConfigError(f"runner.min_free_mb: must be a number >= 0, got {free!r}")
    return {
        "retries": retries,
        "retry_delay_s": tuple(float(d) for d in delay),
        "on_error": on_error,
        "max_failed_ratio": float(ratio),
        "min_free_mb": float(free),
        "prefetch": check_prefetch(block.get("prefetch", DEFAULT_PREFETCH)),
    }


def check_batch_size(value: Any) -> int | None:
    """``batch_size`` is a positive int or null.

    >>> check_batch_size(None), check_batch_size(8)
    (None, 8)
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"batch_size: must be a positive integer or null, got {value!r}")
    return value


def runner_folder_options(runner: Any, key: str) -> tuple[bool, str]:
    """``(resume, shard_subdir)`` of a runner instance, checked; ``key`` names it in errors (``runner``)."""
    resume = getattr(runner, "resume", True)
    if not isinstance(resume, bool):
        raise ConfigError(f"{key}.resume: must be true or false, got {resume!r}")
    shard_subdir = str(getattr(runner, "shard_subdir", "") or "")
    if shard_subdir and (shard_subdir.startswith("/") or ".." in Path(shard_subdir).parts):
        raise ConfigError(f"{key}.shard_subdir: {shard_subdir!r} must be a relative folder inside the output dir")
    return resume, shard_subdir


def check_prefetch(value: Any, key: str = "runner.prefetch") -> int:
    """``runner.prefetch``: units read ahead; ``0``/``false`` off, ``true`` the default depth.

    >>> check_prefetch(4), check_prefetch(False), check_prefetch(True), check_prefetch(None)
    (4, 0, 2, 2)
    """
    if value is None or value is True:
        return DEFAULT_PREFETCH
    if value is False:
        return 0
    if isinstance(value, int) and value >= 0:
        return value
    raise ConfigError(f"{key}: must be an integer >= 0 (batches read ahead of forward; 0 or false: off), got {value!r}")
