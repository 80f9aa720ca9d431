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
   (ours: one path per item, in dataset order: the contract to implement), else a list of records
   naming each item's file (``audio_path`` / ``wav_path``): public ``entries`` / ``examples``, else the
   private lists ESPnet3 202611's recipes keep, which nothing public replaces (:func:`item_records`),
   else a list attribute ``audio_paths`` / ``wav_paths`` / ``paths`` (a plain ``paths`` only of audio
   files: ``.wav``, ``.flac``, ...) of one path per item. ESPnet3's wrappers are looked through: a test
   set is a ``CombinedDataset`` (``datasets``: concatenated) of ``DatasetWithTransform`` (``dataset``). No 202611
   dataset reads a Kaldi ``wav.scp`` (their manifests are TSV and CSV files, or scanned folders), so
   none is looked for. On the driver, read once per dataset fingerprint (every file's path, size and
   modification time) and cached on disk (:meth:`~.layout.StageLayout.lengths_cache`): changed, added
   or removed audio reads them again.
3. **Shape files** of ESPnet's ``collect_stats`` (``<stats_dir>/<test set>/<input_key>_shape``, else
   ``speech_shape``, where the stage config has ``stats_dir``): lines ``<id> <dim>[,<dim>...]``, whose
   ids are ESPnet3 202611's item indices (``0`` .. ``n-1``, each once). Its ``collect_stats_batch``
   writes there each input's shape trimmed to its ``<name>_lengths``, and each ``collect_feats`` output's
   (``feats_shape``): the first dim is **samples** for a raw waveform (``speech_shape`` of raw audio,
   ``16000``) and **frames** for features (``feats_shape``, or a ``speech`` that already holds features:
   ``98,80``), so the unit is said as :data:`SAMPLES_OR_FRAMES`; batches are cut on it and RTFx is not
   reported. Reading the file is as cheap as checking it, so it is not cached.

Cost on the driver (``python -m benchmarks.lengths_cost``, 2-core dev machine, warm page cache, best of
3): the 600 FSDD recordings (0.1-1.3 s) decode in 557 ms, their headers read in 296 ms (1.9x), a cache
hit (one stat per file) in 23 ms (13x); 60 files of 12-37 s: decode 246 ms, headers 25 ms (9.8x), cache
hit 0.5 ms. A header read costs the same whatever the file's length, a decode grows with it.

Read on the driver (and cached) only under ``runner.max_duration``, where they plan the shards and cut
the batches. Without the key the driver reads nothing new (the plan, the manifest and the stage's
identity are as before): each shard reads its own items' headers after its last batch, for the report
only (:func:`shard_seconds`: RTFx, padding), in parallel on the workers; a file it cannot read leaves
that shard's figures out, said once in its log, and nothing else.

>>> found = FoundLengths(np.array([1.5, 2.0]), "audio headers", "s")
>>> found.seconds, found.describe()
(True, 'audio headers (s)')
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from espnet3_prefect._internal.atomic import atomic_open
from espnet3_prefect.errors import BadInputError, describe

log = logging.getLogger("espnet3_prefect")

SECONDS = "s"
#: the unit of a shape file's lengths: its first dim, samples or frames by the input (module docstring)
SAMPLES_OR_FRAMES = "samples or frames"
#: the attribute a dataset with ``lengths()`` in seconds says so with
UNIT_ATTRIBUTE = "lengths_unit"
#: lists of per-item records a dataset may keep: public names, then ESPnet3 202611's private ones
#: (:func:`item_records`), and the fields naming each record's audio file
RECORD_LISTS = ("entries", "examples")
UPSTREAM_RECORD_LISTS = ("_entries", "_examples")
RECORD_PATH_FIELDS = ("audio_path", "wav_path")
PATH_LISTS = ("audio_paths", "wav_paths", "paths")
#: what a plain ``paths`` list must hold to count as audio files (the other names say so themselves)
AUDIO_SUFFIXES = frozenset({".wav", ".flac", ".ogg", ".opus", ".mp3", ".sph", ".aif", ".aiff", ".au", ".w64", ".caf"})
CACHE_VERSION = 1


@dataclass(frozen=True)
class FoundLengths:
    """The lengths found (float64, one per item), where from, and their unit (``"s"``,
    :data:`SAMPLES_OR_FRAMES` for a shape file's, or None: the dataset's own)."""

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
    locate = path_locator(dataset)
    if locate is None:
        return None
    return [locate(i) for i in range(len(dataset))]


def path_locator(dataset: Any, depth: int = 0) -> Callable[[int], str] | None:
    """``index -> audio file`` for the dataset's items, or None when it does not tell them: what
    :func:`audio_paths` lists, one item at a time (a shard looks up its own items only)."""
    if depth > 4 or dataset is None:
        return None
    n = _length(dataset)
    if not n:
        return None
    where = type(dataset).__name__
    method = getattr(dataset, "audio_paths", None)
    if callable(method):
        values = _checked_paths(method(), n, f"{where}.audio_paths()")
        return values.__getitem__
    found = item_records(dataset, n)
    if found is not None:
        name, records, field = found
        return lambda i: _as_path(_field(records[i], field), f"{where}.{name}[{i}].{field}")
    for name in PATH_LISTS:
        values = getattr(dataset, name, None)
        if (
            isinstance(values, (list, tuple))
            and len(values) == n
            and _path_like(values[0])
            and (name != "paths" or Path(values[0]).suffix.lower() in AUDIO_SUFFIXES)
        ):
            return lambda i, values=values, name=name: _as_path(values[i], f"{where}.{name}[{i}]")
    parts = getattr(dataset, "datasets", None)
    if isinstance(parts, (list, tuple)) and parts:
        locators = [path_locator(part, depth + 1) for part in parts]
        sizes = [_length(part) or 0 for part in parts]
        if any(loc is None for loc in locators) or sum(sizes) != n:
            return None
        ends = list(itertools.accumulate(sizes))

        def locate(i: int) -> str:
            part = bisect.bisect_right(ends, i)
            return locators[part](i - (ends[part - 1] if part else 0))

        return locate
    inner = getattr(dataset, "dataset", None)
    if inner is not None and inner is not dataset and _length(inner) == n:
        return path_locator(inner, depth + 1)
    return None


def item_records(dataset: Any, n: int) -> tuple[str, Sequence[Any], str] | None:
    """``(attribute, records, field)``: the list of ``n`` per-item records the dataset keeps and the field
    of each naming its audio file, or None. A public ``entries`` / ``examples`` list first; else the
    private lists of ESPnet3's recipe datasets, the one place a private attribute is read.

    Why: checked against ESPnet 202611's wheel (``egs3``), ``MiniAn4Dataset`` keeps ``_entries``
    (``wav_path``), ``LibriSpeech100Dataset`` and ``SPGISpeechDataset`` keep ``_examples``
    (``audio_path``), and nothing public tells the files: ``BaseDataset`` promises ``__len__`` and
    ``__getitem__`` (which decodes the audio); the manifests (mini_an4's TSV, SPGISpeech's CSV) are
    found through module-private configuration, and LibriSpeech's scan of its folders is private too.
    Fallback: a later ESPnet that renames or drops these lists gives None here, and the lengths come
    from the next source (a list attribute of paths, ESPnet3's wrappers, else a shape file).
    """
    for name in RECORD_LISTS + UPSTREAM_RECORD_LISTS:
        records = getattr(dataset, name, None)
        if isinstance(records, (list, tuple)) and len(records) == n:
            field = next((f for f in RECORD_PATH_FIELDS if _path_like(_field(records[0], f))), None)
            if field is not None:
                return name, records, field
    return None


def _field(record: Any, name: str) -> Any:
    return record.get(name) if isinstance(record, Mapping) else getattr(record, name, None)


def _as_path(value: Any, where: str) -> str:
    if not _path_like(value):
        raise BadInputError(f"{where} is {value!r}: must be a path")
    return os.fspath(value)


def _length(dataset: Any) -> int | None:
    try:
        return len(dataset)
    except Exception:  # noqa: BLE001 - not sized: tells nothing
        return None


def _path_like(value: Any) -> bool:
    return isinstance(value, (str, os.PathLike))


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


def shard_seconds(dataset: Any, items: Sequence[int]) -> list[float] | None:
    """Seconds of audio of ``items`` (dataset indices) from their files' headers, for a shard's report
    when the driver knew no lengths; None when the dataset does not tell its files. Raises
    :class:`BadInputError` naming the item and file that cannot be read (the caller only reports it).

    >>> shard_seconds([1, 2], [0, 1]) is None
    True
    """
    locate = path_locator(dataset)
    if locate is None:
        return None
    seconds = []
    for index in items:
        path = locate(int(index))
        try:
            seconds.append(header_seconds(path))
        except Exception as exc:  # noqa: BLE001 - named, on one line
            raise BadInputError(f"item {index}: audio file {path}: cannot read its header: {describe(exc)}") from None
    return seconds


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
    """The first dim of each line of an ESPnet shape file (``<id> <dim>[,<dim>...]``) whose ids are the
    item indices ``0`` .. ``n-1`` (ESPnet3 202611's collect_stats ids), in index order: samples or frames
    (:data:`SAMPLES_OR_FRAMES`); a file that does not describe these ``n`` items fails on one line naming
    it and the first line that does not fit.
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
            index, first_dim = int(parts[0]), float(parts[1].split(",")[0])
        except (ValueError, IndexError):
            raise BadInputError(
                f"shape file {path}: line {number} {line[:60]!r}: expected '<item index> <length>[,<dim>]'"
            ) from None
        if not 0 <= index < n or not np.isnan(values[index]) or not (first_dim >= 0 and np.isfinite(first_dim)):
            raise BadInputError(
                f"shape file {path}: line {number} {line[:60]!r}: not one of {n} items' lengths (an index "
                f"0..{n - 1} once, a length >= 0)"
            )
        values[index] = first_dim
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
        return FoundLengths(shape_lengths(shapes, n_items), f"shape file {shapes}", SAMPLES_OR_FRAMES)
    return None
