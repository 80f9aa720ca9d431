"""Mark done: the ``split.N/done`` marker, written last, is the source of truth for resume.

It records what the shard covered (config fingerprint, index range, item count) and a checksum
of every file the shard wrote, so a marker whose files were removed or changed is not trusted.
"""

from __future__ import annotations

import json
from pathlib import Path

from .atomic import atomic_write_text, file_digest
from .config import diff_keys

MARKER_NAME = "done"
MARKER_VERSION = 1


def shard_files(shard_dir: Path) -> dict[str, dict]:
    """Checksums of every file under ``shard_dir`` but the marker, by relative path."""
    out = {}
    for path in sorted(p for p in shard_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(shard_dir).as_posix()
        if rel != MARKER_NAME and not path.name.startswith("."):
            out[rel] = file_digest(path)
    return out


def write_marker(shard_dir: Path, record: dict) -> Path:
    """Write ``shard_dir/done`` atomically; ``record`` must hold ``files`` from :func:`shard_files`."""
    path = shard_dir / MARKER_NAME
    atomic_write_text(path, json.dumps({"version": MARKER_VERSION, **record}, sort_keys=True, indent=1) + "\n")
    return path


def read_marker(shard_dir: Path) -> dict | None:
    """The marker's record, or None when it is absent or unreadable."""
    try:
        return json.loads((shard_dir / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def check_marker(shard_dir: Path, expect: dict) -> str | None:
    """Why the shard in ``shard_dir`` must run again, or None when its marker and files are intact.

    ``expect`` holds ``fingerprint``, ``start``, ``stop`` and optionally ``identity`` (the
    fingerprinted config, used to name what changed).
    """
    record = read_marker(shard_dir)
    if record is None:
        return f"{shard_dir.name}: no done marker"
    if record.get("version") != MARKER_VERSION:
        return f"{shard_dir.name}: marker version {record.get('version')} is not {MARKER_VERSION}"
    if (record.get("start"), record.get("stop")) != (expect["start"], expect["stop"]):
        return (f"{shard_dir.name}: covered items [{record.get('start')}, {record.get('stop')}), "
                f"the plan now wants [{expect['start']}, {expect['stop']})")
    if record.get("fingerprint") != expect["fingerprint"]:
        changed = diff_keys(record.get("identity") or {}, expect.get("identity") or {})
        what = ", ".join(changed[:5]) if changed else "the config"
        return f"{shard_dir.name}: config changed since it ran ({what})"
    for rel, digest in (record.get("files") or {}).items():
        path = shard_dir / rel
        if not path.is_file():
            return f"{shard_dir.name}: {rel} is missing"
        if file_digest(path) != digest:
            return f"{shard_dir.name}: {rel} changed since the marker was written"
    return None
