"""Each item's length, from whatever tells it cheaply: the dataset's own ``lengths()``, else its audio
files' headers (no decode), else the recipe's ``collect_stats`` shape files. What
``runner.max_duration`` cuts batches by and the run's RTFx counts audio seconds with.

Sources, in order (the first that answers wins):

1. ``dataset.lengths()``: one number per item, in the dataset's units (checked in :mod:`.sizing`).
   Seconds when the dataset says so with a ``lengths_unit = "s"`` attribute (else the units are its own:
   batches are cut on them, RTFx is not reported).
2. **Audio headers**, in seconds (frames / sample rate, read by ``soundfile.info``, or the standard
   library's ``wave`` for a ``.wav`` where soundfile is absent; nothing is decoded). The files are the
   dataset's own, found without reading an item (reading one decodes it): a method ``audio_paths()``
   (ours: one path per item, in dataset order: the contract to implement), else the record lists
   ESPnet3 202611's recipes keep (``mini_an4``: ``_entries`` of records with ``wav_path``;
   ``librispeech_100`` and ``spgispeech``: ``_examples`` with ``audio_path``), else a list attribute
   ``audio_paths`` / ``wav_paths`` / ``paths`` of one path per item. ESPnet3's wrappers are looked
   through: a test set is a ``CombinedDataset`` (``datasets``: concatenated) of
   ``DatasetWithTransform`` (``dataset``). No 202611 dataset reads a Kaldi ``wav.scp`` (their
   manifests are TSV and CSV files, or scanned folders), so none is looked for. Read once per dataset
   fingerprint (every file's path, size and modification time) and cached on disk
   (:meth:`~.layout.StageLayout.lengths_cache`): changed, added or removed audio reads them again.
3. **Shape files** of ESPnet's ``collect_stats`` (``<stats_dir>/<test set>/<input_key>_shape``, else
   ``speech_shape``, where the stage config has ``stats_dir``): lines ``<id> <length>[,<dim>...]``,
   whose ids are ESPnet3 202611's item indices (``0`` .. ``n-1``, each once); the first number is in
   samples for raw audio (frames for features), so batches are cut on it and RTFx is not reported.
   Reading the file is as cheap as checking it, so it is not cached.

Cost on the driver (``python -m benchmarks.lengths_cost``, 2-core dev machine, warm page cache, best of
3): the 600 FSDD recordings (0.1-1.3 s) decode in 557 ms, their headers read in 296 ms (1.9x), a cache
hit (one stat per file) in 23 ms (13x); 60 files of 12-37 s: decode 246 ms, headers 25 ms (9.8x), cache
hit 0.5 ms. A header read costs the same whatever the file's length, a decode grows with it.

Header lengths plan and cut batches only under ``runner.max_duration`` (with it the plan is ours
anyway); without the key they are read for the report only (RTFx), never for the shard plan nor the
stage's identity, so a run without the key plans exactly as before.

>>> found = FoundLengths(np.array([1.5, 2.0]), "audio headers", "s")
>>> found.seconds, found.describe()
(True, 'audio headers (s)')
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from espnet3_prefect._internal.atomic import atomic_open
from espnet3_prefect.errors import BadInputError, describe

log = logging.getLogger("espnet3_prefect")

SECONDS = "s"
SAMPLES = "samples"
#: the attribute a dataset with ``lengths()`` in seconds says so with
UNIT_ATTRIBUTE = "lengths_unit"
#: record lists of ESPnet3 202611's recipe datasets, and the fields naming each record's audio file
RECORD_LISTS = ("_entries", "_examples", "entries", "examples")
RECORD_PATH_FIELDS = ("audio_path", "wav_path")
PATH_LISTS = ("audio_paths", "wav_paths", "paths")
CACHE_VERSION = 1


@dataclass(frozen=True)
class FoundLengths:
    """The lengths found (float64, one per item), where from, and their unit (``"s"``, ``"samples"``,
    or None: the dataset's own)."""

    values: Any
    source: str
    unit: str | None

    @property
    def seconds(self) -> bool:
        return self.unit == SECONDS

    def describe(self) -> str:
        return f"{self.source} ({self.unit or 'the dataset units'})"


def unit_of(dataset: Any) -> str | None:
    """The unit a dataset's ``lengths()`` are in: ``"s"`` when it says so (``lengths_unit``), else None.

    >>> class D: lengths_unit = "s"
    >>> unit_of(D()), unit_of(object())
    ('s', None)
    """
    unit = getattr(dataset, UNIT_ATTRIBUTE, None)
    return unit if isinstance(unit, str) and unit else None


# -- audio files -----------------------------------------------------------------------------------


def audio_paths(dataset: Any) -> list[str] | None:
    """The dataset's audio files, one per item in dataset order, found without reading an item; None when
    the dataset does not tell them (see the module docstring for where they are looked for).

    >>> class D:
    ...     paths = ["a.wav", "b.wav"]
    ...     def __len__(self): return 2
    >>> class Wrapped:  # as ESPnet3's DatasetWithTransform
    ...     def __init__(self, d): self.dataset = d
    ...     def __len__(self): return len(self.dataset)
    >>> audio_paths(Wrapped(D())), audio_paths([1, 2])
    (['a.wav', 'b.wav'], None)
    """
    return _paths(dataset, depth=0)


def _paths(dataset: Any, depth: int) -> list[str] | None:
    if depth > 4 or dataset is None:
        return None
    n = _length(dataset)
    if n is None:
        return None
    method = getattr(dataset, "audio_paths", None)
    if callable(method):
        return _checked_paths(method(), n, type(dataset).__name__ + ".audio_paths()")
    for name in RECORD_LISTS:
        records = getattr(dataset, name, None)
        if isinstance(records, (list, tuple)) and len(records) == n and n:
            found = _record_paths(records)
            if found is not None:
                return found
    for name in PATH_LISTS:
        values = getattr(dataset, name, None)
        if isinstance(values, (list, tuple)) and len(values) == n and n and all(_path_like(v) for v in values):
            return [os.fspath(v) for v in values]
    parts = getattr(dataset, "datasets", None)
    if isinstance(parts, (list, tuple)) and parts:
        joined: list[str] = []
        for part in parts:
            found = _paths(part, depth + 1)
            if found is None:
                return None
            joined.extend(found)
        return joined if len(joined) == n else None
    inner = getattr(dataset, "dataset", None)
    if inner is not None and inner is not dataset and _length(inner) == n:
        return _paths(inner, depth + 1)
    return None


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except Exception:  # noqa: BLE001 - not sized: tells nothing
        return None


def _path_like(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


def _record_paths(records: Sequence[Any]) -> list[str] | None:
    for field in RECORD_PATH_FIELDS:
        values = [
            (record.get(field) if isinstance(record, Mapping) else getattr(record, field, None)) for record in records
        ]
        if all(_path_like(v) for v in values):
            return [os.fspath(v) for v in values]
    return None


def _checked_paths(values: Any, n: int, where: str) -> list[str]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__len__") or len(values) != n:
        count = len(values) if hasattr(values, "__len__") else type(values).__name__
        raise BadInputError(
            f"{where}: returned {count} paths for {n} items (one audio file per item, in dataset order)"
        )
    paths = list(values)
    for index, value in enumerate(paths):
        if not _path_like(value):
            raise BadInputError(f"{where}[{index}] is {value!r}: must be a path")
    return [os.fspath(v) for v in paths]


def header_seconds(path: str) -> float:
    """Seconds of audio in ``path``, from its header (frames / rate), never decoding the samples.

    Raises OSError / RuntimeError / ValueError for a file it cannot read (the caller names the item).
    """
    try:
        import soundfile
    except ImportError:
        soundfile = None
    if soundfile is not None:
        info = soundfile.info(path)
        if not info.samplerate:
            raise ValueError("no sample rate in its header")
        return float(info.frames) / float(info.samplerate)
    import wave

    with wave.open(path, "rb") as reader:
        return reader.getnframes() / float(reader.getframerate())


def files_fingerprint(paths: Sequence[str]) -> str:
    """sha256 over each file's path, size and modification time (ns): what the header cache is keyed by.
    A file that cannot be stat'ed fails on one line naming it."""
    sha = hashlib.sha256(f"v{CACHE_VERSION}\n".encode())
    for index, path in enumerate(paths):
        try:
            stat = os.stat(path)
        except OSError as exc:
            raise BadInputError(f"item {index}: audio file {path}: {describe(exc)}") from None
        sha.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return sha.hexdigest()


def header_lengths(paths: Sequence[str], cache_file: Path | None = None) -> Any:
    """Seconds per file (float64), read from the headers, or from ``cache_file`` when it holds the same
    files' lengths (same fingerprint). The cache is written whole (atomically) or not at all."""
    key = files_fingerprint(paths)
    if cache_file is not None:
        cached = _read_cache(cache_file, key, len(paths))
        if cached is not None:
            return cached
    values = np.empty(len(paths), dtype=np.float64)
    for index, path in enumerate(paths):
        try:
            values[index] = header_seconds(path)
        except Exception as exc:  # noqa: BLE001 - named, on one line
            raise BadInputError(f"item {index}: audio file {path}: cannot read its header: {describe(exc)}") from None
    if cache_file is not None:
        _write_cache(cache_file, key, values)
    return values


def _read_cache(cache_file: Path, key: str, n: int) -> Any:
    try:
        with np.load(cache_file, allow_pickle=False) as data:
            if str(data["key"]) != key or data["lengths"].shape != (n,):
                return None
            return np.asarray(data["lengths"], dtype=np.float64)
    except (OSError, ValueError, KeyError):
        return None


def _write_cache(cache_file: Path, key: str, values: Any) -> None:
    try:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        with atomic_open(cache_file, "wb") as out:
            np.savez(out, key=np.array(key), lengths=values)
    except OSError as exc:  # a read-only folder: the lengths are still good, only not kept
        log.info("lengths cache %s not written: %s", cache_file, describe(exc))


# -- shape files -----------------------------------------------------------------------------------


def shape_file(stats_dir: Any, test_set: str, input_key: Any) -> Path | None:
    """``<stats_dir>/<test_set>/<input_key>_shape`` (else ``speech_shape``) when it exists."""
    if not stats_dir:
        return None
    keys = [input_key] if isinstance(input_key, str) else list(input_key or [])
    for key in [*keys[:1], "speech"]:
        path = Path(str(stats_dir)) / test_set / f"{key}_shape"
        if path.is_file():
            return path
    return None


def shape_lengths(path: Path, n: int) -> Any:
    """The first number of each line of an ESPnet shape file (``<id> <length>[,<dim>...]``) whose ids are
    the item indices ``0`` .. ``n-1`` (ESPnet3 202611's collect_stats ids), in index order; a file that
    does not describe these ``n`` items fails on one line naming it and the first line that does not fit.
    """
    values = np.full(n, np.nan)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise BadInputError(f"shape file {path}: {describe(exc)}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        parts = line.split()
        try:
            index, length = int(parts[0]), float(parts[1].split(",")[0])
        except (ValueError, IndexError):
            raise BadInputError(
                f"shape file {path}: line {number} {line[:60]!r}: expected '<item index> <length>[,<dim>]'"
            ) from None
        if not 0 <= index < n or not np.isnan(values[index]) or not (length >= 0 and np.isfinite(length)):
            raise BadInputError(
                f"shape file {path}: line {number} {line[:60]!r}: not one of {n} items' lengths (an index "
                f"0..{n - 1} once, a length >= 0)"
            )
        values[index] = length
    missing = np.flatnonzero(np.isnan(values))
    if len(missing):
        raise BadInputError(f"shape file {path}: no line for item {int(missing[0])} (of {n} items)")
    return values


# -- all sources -----------------------------------------------------------------------------------


def has_file_source(dataset: Any, test_set: str, stats_dir: Any = None, input_key: Any = None) -> bool:
    """Whether sources 2 or 3 can tell the lengths (without reading them)."""
    return audio_paths(dataset) is not None or shape_file(stats_dir, test_set, input_key) is not None


def lengths_from_files(
    dataset: Any, n_items: int, test_set: str, *, cache_file: Path | None, stats_dir: Any = None, input_key: Any = None
) -> FoundLengths | None:
    """Sources 2 and 3 (audio headers, shape files) for a dataset without ``lengths()``; None when
    neither tells them. The header lengths are cached in ``cache_file``."""
    paths = audio_paths(dataset)
    if paths is not None:
        if len(paths) != n_items:
            raise BadInputError(f"test set {test_set!r}: {len(paths)} audio files for {n_items} items")
        return FoundLengths(header_lengths(paths, cache_file), "audio headers", SECONDS)
    shapes = shape_file(stats_dir, test_set, input_key)
    if shapes is not None:
        return FoundLengths(shape_lengths(shapes, n_items), f"shape file {shapes}", SAMPLES)
    return None


def summary_of(found: FoundLengths | None) -> dict[str, Any] | None:
    """What the run's report says of the lengths: source, unit, total.

    >>> summary_of(FoundLengths(np.array([1.0, 2.5]), "audio headers", "s"))
    {'source': 'audio headers', 'unit': 's', 'total': 3.5}
    """
    if found is None:
        return None
    return {"source": found.source, "unit": found.unit, "total": round(float(np.sum(found.values)), 6)}
