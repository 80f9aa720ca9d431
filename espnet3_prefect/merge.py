"""Merge: shard outputs concatenated in shard order into one file, published atomically."""

from __future__ import annotations

import json
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
                shutil.copyfileobj(handle, out, 1 << 20)
    return dest


MERGED_MANIFEST = ".merged.json"


def remove_merged(test_dir: Path) -> list[str]:
    """Delete the merged outputs a previous merge recorded (they no longer match the shards)."""
    manifest = test_dir / MERGED_MANIFEST
    try:
        outputs = json.loads(manifest.read_text()).get("outputs", {})
    except (OSError, ValueError):
        return []
    removed = []
    for path in outputs.values():
        target = Path(path)
        if target.parent == test_dir and target.is_file():
            target.unlink()
            removed.append(target.name)
    manifest.unlink(missing_ok=True)
    return removed
