"""What the driver learns of a test set before the shards are planned: its size and item lengths
(``provider.build_dataset`` on the driver, as ESPnet3's ``infer()`` does), and the fingerprints
that join a stage's identity (the dataset's own, its lengths', the code's). Moved out of
``stage.py``.
"""

from __future__ import annotations

import hashlib
import inspect
import numbers
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from espnet3_prefect.errors import BadInputError, ConfigError, describe
from espnet3_prefect.pipeline.lengths import has_file_source, lengths_from_files, unit_of

if TYPE_CHECKING:
    from espnet3_prefect.pipeline.stage import Stage


@dataclass(frozen=True)
class Sizing:
    """What the plan needs to know of a test set's dataset: its length, its own fingerprint, and
    each item's cost when known (float64 array, checked) with their sha256: the dataset's ``lengths()``,
    or under ``runner.max_duration`` the lengths read from its files. ``unit``/``source``: what the
    lengths are (:mod:`espnet3_prefect.pipeline.lengths`)."""

    n_items: int
    dataset_id: str | None = None
    lengths: Any = None
    lengths_id: str | None = None
    unit: str | None = None
    source: str | None = None


def size_on_driver(stage: Stage) -> Sizing | None:
    """``provider.build_dataset(config)`` on the driver, as ESPnet3's ``infer()`` does before it runs a
    test set: its length plans the shards, its fingerprint joins the stage's, and a typo in
    ``input_key`` fails here, before any cluster starts. None for a provider without
    ``build_dataset`` (the ``build-env`` task then sizes the test set on a worker).

    Item lengths: the dataset's ``lengths()``; under ``runner.max_duration``, else its audio files'
    headers or the recipe's shape files (:mod:`espnet3_prefect.pipeline.lengths`), which are required
    there. Without the key nothing else is read here: the plan is today's, and each shard reads its own
    items' headers for the report (:func:`espnet3_prefect.pipeline.lengths.shard_seconds`)."""
    return size_dataset(stage, checked_dataset(stage))


def size_dataset(stage: Stage, dataset: Any) -> Sizing | None:
    """:func:`size_on_driver` for a dataset already built (by :func:`checked_dataset`; None: none)."""
    if dataset is None:
        return None
    n_items = len(dataset)
    ident = dataset_id(dataset)
    lengths = dataset_lengths(dataset, n_items, stage.test_set)
    if lengths is not None:
        return Sizing(n_items, ident, lengths, lengths_fingerprint(lengths), unit=unit_of(dataset), source="lengths()")
    if lengths_key(stage) is None:
        return Sizing(n_items, ident)
    found = lengths_from_files(dataset, n_items, stage.test_set, **_file_sources(stage))
    if found is None:
        raise ConfigError(no_lengths(stage, dataset))
    values = found.values
    return Sizing(n_items, ident, values, lengths_fingerprint(values), unit=found.unit, source=found.source)


def _file_sources(stage: Stage) -> dict[str, Any]:
    """Where :func:`~.lengths.lengths_from_files` looks: the header cache, ``stats_dir``, ``input_key``."""
    config = stage.config
    stats_dir = config.get("stats_dir") if config is not None and hasattr(config, "get") else None
    params = getattr(getattr(stage.runner, "provider", None), "params", None) or {}
    return {"cache_file": stage.layout.lengths_cache, "stats_dir": stats_dir, "input_key": params.get("input_key")}


def checked_dataset(stage: Stage) -> Any:
    """``provider.build_dataset(config)`` on the driver, not empty, its item 0 carrying every input
    key; None for a provider without ``build_dataset``. The command line and ``infer()`` call it
    before a server starts, so a typo in ``input_key`` is the first and only thing printed."""
    provider = getattr(stage.runner, "provider", None)
    build = getattr(provider, "build_dataset", None)
    if not callable(build):
        return None
    dataset = build(stage.config if stage.config is not None else provider.config)
    if len(dataset) == 0:
        raise BadInputError(f"test set {stage.test_set!r}: dataset is empty; check the dataset manifest")
    params = getattr(provider, "params", None) or {}
    check_input_keys(dataset, params.get("input_key"), params.get("inference_contract"), stage.test_set)
    return dataset


def require_lengths(stage: Stage, dataset: Any) -> None:
    """With ``runner.max_duration`` or ``parallel.shard_duration`` the items' lengths must be known: the
    dataset's ``lengths()``, its audio files or the recipe's shape files (checked before a server
    starts, without reading them)."""
    if lengths_key(stage) is None:
        return
    method = getattr(dataset, "lengths", None)
    if callable(method) and _callable_without_arguments(method):
        return
    sources = _file_sources(stage)
    if not has_file_source(dataset, stage.test_set, sources["stats_dir"], sources["input_key"]):
        raise ConfigError(no_lengths(stage, dataset))


def lengths_key(stage: Stage) -> str | None:
    """The key of the stage that needs its dataset's ``lengths()``, or None."""
    if getattr(stage.work, "max_duration", None) is not None:
        return "runner.max_duration"
    if getattr(stage, "shard_duration", None) is not None:
        return "parallel.shard_duration"
    return None


def no_lengths(stage: Stage, dataset: Any = None) -> str:
    """The one line refusing ``runner.max_duration`` (batches cut by length) or ``parallel.shard_duration``
    (shards sized by length) for a test set whose items' lengths are unknown."""
    what = f"its dataset ({type(dataset).__name__})" if dataset is not None else "its provider (no build_dataset())"
    key = lengths_key(stage) or "runner.max_duration"
    purpose = "cut batches by" if key == "runner.max_duration" else "size shards by"
    return (
        f"{key}: test set {stage.test_set!r}: {what} has no lengths() to {purpose} "
        f"(one number per item, in the units of {key.split('.')[1]}), no audio_paths() to read them from, "
        f"and no <stats_dir>/{stage.test_set}/*_shape file; add lengths() or audio_paths(), or drop the key"
    )


def dataset_lengths(dataset: Any, n_items: int, test_set: str) -> Any:
    """``dataset.lengths()`` checked (one finite number >= 0 per item, in dataset order) as a float64
    array, or None when the dataset has no ``lengths``. A bad one fails on one line.

    >>> class D:
    ...     def __len__(self): return 3
    ...     def lengths(self): return [1.5, 0, 7]
    >>> dataset_lengths(D(), 3, "t").tolist()
    [1.5, 0.0, 7.0]
    """
    import numpy as np

    method = getattr(dataset, "lengths", None)
    if not callable(method) or not _callable_without_arguments(method):
        return None  # not the protocol (an attribute, or a method that needs arguments): plan by counts
    where = f"test set {test_set!r}: {type(dataset).__name__}.lengths()"
    try:
        raw = method()
    except Exception as exc:  # noqa: BLE001 - named, on one line
        raise BadInputError(f"{where} failed: {describe(exc)}") from None
    if isinstance(raw, (str, bytes, Mapping)) or not hasattr(raw, "__len__"):
        raise BadInputError(f"{where}: must return a sequence with one number per item, got {type(raw).__name__}")
    values = np.asarray(raw) if not isinstance(raw, np.ndarray) else raw
    if values.ndim != 1 or len(values) != n_items:
        count = len(values) if values.ndim == 1 else f"an array of shape {values.shape}"
        raise BadInputError(
            f"{where}: returned {count} values for {n_items} items (one number per item, in dataset order)"
        )
    if values.dtype.kind not in "iuf":
        bad = next(
            (
                i
                for i, v in enumerate(raw)
                if isinstance(v, (bool, np.bool_)) or not isinstance(v, (numbers.Real, np.integer, np.floating))
            ),
            0,
        )
        raise BadInputError(f"{where}[{bad}] is {raw[bad]!r} ({type(raw[bad]).__name__}): lengths must be numbers")
    values = values.astype(np.float64)
    bad_values = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if len(bad_values):
        bad = int(bad_values[0])
        raise BadInputError(f"{where}[{bad}] is {raw[bad]!r}: lengths must be finite numbers >= 0")
    return values


def _callable_without_arguments(method: Any) -> bool:
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return True
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)


def lengths_fingerprint(lengths: Any) -> str:
    """sha256 of the checked lengths (float64, little-endian): the same lengths, the same plan."""
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(lengths, dtype="<f8").tobytes()).hexdigest()


def check_input_keys(dataset: Any, input_key: Any, contract: Any, test_set: str) -> None:
    """Item 0 must carry every (non-optional) input key: a typo in ``input_key`` fails once, here,
    not in every shard. Datasets whose items are not mappings are left to the runner."""
    keys = [input_key] if isinstance(input_key, str) else list(input_key or [])
    inputs = contract.get("inputs") if isinstance(contract, Mapping) else None
    optional = {name for name, spec in (inputs or {}).items() if isinstance(spec, Mapping) and spec.get("optional")}
    try:
        item = dataset[0]
    except Exception:  # noqa: BLE001 - reading an item is the runner's business; it names the item
        return
    if not isinstance(item, Mapping):
        return
    missing = [k for k in keys if k not in item and k not in optional]
    if missing:
        raise BadInputError(
            f"input_key: {missing[0]!r} is not a field of the items of test set {test_set!r} "
            f"(item 0 has: {', '.join(sorted(map(str, item)))})"
        )


def dataset_id(dataset: Any) -> str | None:
    """The dataset's own fingerprint when it offers ``fingerprint()`` (so changed data redoes shards)."""
    method = getattr(dataset, "fingerprint", None)
    return str(method()) if callable(method) else None


def code_identity(*objects: Any) -> str:
    """sha256 of the source of the given classes/functions (qualified name where source is absent)."""
    sha = hashlib.sha256()
    for obj in objects:
        if obj is not None:
            sha.update(_source(obj).encode())
    return sha.hexdigest()


def _source(obj: Any) -> str:
    """``inspect.getsource``; CPython 3.11's parser can raise ``SystemError: AST constructor recursion
    depth mismatch`` when another thread parses at the same moment (a class's source is found by
    parsing its module), so that error is retried, and we never give up on a transient one."""
    for attempt in range(5):
        try:
            with _SOURCE_LOCK:
                return inspect.getsource(obj)
        except (OSError, TypeError):
            return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', obj)}"
        except SystemError:
            time.sleep(0.05 * (attempt + 1))
    with _SOURCE_LOCK:
        return inspect.getsource(obj)


_SOURCE_LOCK = threading.Lock()
