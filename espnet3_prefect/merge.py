"""Merge: shard outputs concatenated in shard order into one file, published atomically."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Sequence

from .atomic import atomic_open


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


MERGED_MANIFEST = ".merged.json"


def read_merged_manifest(test_dir: Path) -> dict | None:
    """What the last merge of ``test_dir`` recorded, or None."""
    try:
        return json.loads((test_dir / MERGED_MANIFEST).read_text())
    except (OSError, ValueError):
        return None


def remove_merged(test_dir: Path) -> list[str]:
    """Delete the merged outputs a previous merge recorded (they no longer match the shards)."""
    manifest = test_dir / MERGED_MANIFEST
    outputs = (read_merged_manifest(test_dir) or {}).get("outputs", {})
    removed = []
    for path in outputs.values():
        target = Path(path)
        if target.parent == test_dir and target.is_file():
            target.unlink()
            removed.append(target.name)
    manifest.unlink(missing_ok=True)
    return removed
