"""Merge: the runner's ``merge(shard_dirs)`` runs on the driver; we record what it wrote.

Which files a merge produced is found by comparing the output folder before and after it (a
recipe's ``merge`` may return None, True, a dict or anything), and recorded with their checksums in
``.merged.json``, the commit record of a finished test set. :func:`concat_files` is the streamed,
atomic concatenation our own runners use.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Sequence

from espnet3_prefect._internal.atomic import atomic_open, atomic_write_text, file_digest
from espnet3_prefect.pipeline.layout import FAILURES_NAME, MANIFEST_NAME, StageLayout, shard_index


def concat_files(parts: Sequence[Path], dest: Path) -> Path:
    """Write the bytes of ``parts``, in order, to ``dest`` (streamed, atomic).

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> _ = (d / "a").write_text("1\\n"); _ = (d / "b").write_text("2\\n")
    >>> concat_files([d / "a", d / "b"], d / "ab").read_text()
    '1\\n2\\n'
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(dest, "wb") as out:
        for part in parts:
            with open(part, "rb") as handle:
                _copy(handle, out)
    return dest


def _copy(src, dst) -> None:
    """Copy in the kernel where the platform can (as ``cat`` does), else through a buffer."""
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is not None:
        dst.flush()
        copied = 0
        try:
            while n := copy_range(src.fileno(), dst.fileno(), 1 << 30):
                copied += n
            return
        except OSError:
            if copied:  # never fall back after a partial copy: that would duplicate bytes
                raise
            dst.seek(0, os.SEEK_END)  # unsupported here (old kernel, odd filesystem): buffer copy
    shutil.copyfileobj(src, dst, 1 << 20)


_NOT_OUTPUTS = (MANIFEST_NAME, FAILURES_NAME)


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    """``{relative path: (size, mtime_ns)}`` of the files under ``folder`` that a merge may write:
    shard folders, hidden files and our bookkeeping are left out."""
    found: dict[str, tuple[int, int]] = {}
    if not folder.is_dir():
        return found
    for root, dirs, files in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".") and shard_index(d) is None]
        for name in files:
            if name.startswith(".") or name in _NOT_OUTPUTS:
                continue
            path = Path(root) / name
            stat = path.stat()
            found[path.relative_to(folder).as_posix()] = (stat.st_size, stat.st_mtime_ns)
    return found


def written_since(folder: Path, before: dict[str, tuple[int, int]]) -> list[Path]:
    """Files under ``folder`` that are new or changed since ``before`` (a :func:`snapshot`)."""
    return [folder / rel for rel, stat in sorted(snapshot(folder).items()) if before.get(rel) != stat]


def write_merged_record(layout: StageLayout, record: dict, outputs: list[Path]) -> dict:
    """Record a finished merge: its outputs (by name) with their checksums."""
    full = {**record, "outputs": {p.relative_to(layout.output_dir).as_posix(): str(p) for p in outputs},
            "digests": {p.relative_to(layout.output_dir).as_posix(): file_digest(p) for p in outputs}}
    atomic_write_text(layout.merged_record, json.dumps(full, sort_keys=True))
    return full


def read_merged_record(layout: StageLayout) -> dict | None:
    """What the last merge of this test set recorded, or None."""
    try:
        data = json.loads(layout.merged_record.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def merged_outputs_intact(layout: StageLayout, record: dict) -> str | None:
    """Why the recorded merged outputs cannot be trusted, or None when every one is unchanged."""
    for rel, digest in (record.get("digests") or {}).items():
        path = layout.output_dir / rel
        if not path.is_file() or file_digest(path) != digest:
            return f"merged output {rel} changed or is missing"
    return None


def remove_merged(layout: StageLayout) -> list[str]:
    """Delete the merged outputs the last merge recorded (they no longer match the shards)."""
    record = read_merged_record(layout) or {}
    removed = []
    for rel in record.get("outputs", {}):
        target = layout.output_dir / rel
        if target.is_file():
            target.unlink()
            removed.append(rel)
    layout.merged_record.unlink(missing_ok=True)
    return removed
