"""Mark done: ``split.N/done``, written last, is the commit point of a shard and the source of truth
for resume.

Upstream ESPnet3 writes an empty ``done`` and trusts its existence; ours holds what the shard covered
(config fingerprint, item range) and a checksum of every file the shard wrote, so a marker whose
files were removed or changed, or a shard another tool wrote, is never taken as done by us. Upstream
still sees a ``done`` file, and ``manifest.json`` tells it which plan the markers belong to.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from espnet3_prefect._internal.atomic import atomic_write_text, file_digest, fsync_dir
from espnet3_prefect.disk.layout import DONE_NAME, SHARD_BOOKKEEPING

MARKER_VERSION = 2


def shard_files(shard_dir: Path) -> dict[str, str]:
    """Checksums of every file under ``shard_dir`` but the marker, the lock and hidden files."""
    out = {}
    for path in sorted(p for p in Path(shard_dir).rglob("*") if p.is_file()):
        rel = path.relative_to(shard_dir).as_posix()
        if rel not in SHARD_BOOKKEEPING and not path.name.startswith("."):
            out[rel] = file_digest(path)
    return out


def write_marker(shard_dir: Path, record: dict) -> Path:
    """Checksum the shard's files and write ``shard_dir/done`` atomically (after fsync of its files)."""
    path = Path(shard_dir) / DONE_NAME
    files = shard_files(Path(shard_dir))
    _fsync_files(Path(shard_dir), files)
    record = {"version": MARKER_VERSION, **record, "files": files}
    atomic_write_text(path, json.dumps(record, sort_keys=True, indent=1) + "\n")
    return path


def _fsync_files(shard_dir: Path, files: dict) -> None:
    """The runner's hooks close their files but need not sync them: the marker must not outlive them."""
    folders = {shard_dir}
    for rel in files:
        path = shard_dir / rel
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        folders.add(path.parent)
    for folder in folders:
        fsync_dir(folder)


def read_marker(shard_dir: Path) -> dict | None:
    """The marker's record, or None when it is absent, empty (upstream's) or unreadable."""
    try:
        data = json.loads((Path(shard_dir) / DONE_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def remove_marker(shard_dir: Path) -> None:
    (Path(shard_dir) / DONE_NAME).unlink(missing_ok=True)


def check_marker(shard_dir: Path, expect: dict) -> str | None:
    """Why the shard in ``shard_dir`` must run again, or None when its marker and files are intact.

    ``expect`` holds ``fingerprint``, ``start``, ``stop`` and optionally ``identity`` (the
    fingerprinted config, used to name what changed).
    """
    done = Path(shard_dir) / DONE_NAME
    record = read_marker(shard_dir)
    if record is None:
        if done.is_file() and done.stat().st_size == 0:
            return f"{shard_dir.name}: written by upstream ESPnet3 (empty done file, nothing to verify it by)"
        return f"{shard_dir.name}: no done marker"
    if record.get("version") != MARKER_VERSION:
        return f"{shard_dir.name}: marker version {record.get('version')} is not {MARKER_VERSION}"
    if (record.get("start"), record.get("stop")) != (expect["start"], expect["stop"]):
        return (
            f"{shard_dir.name}: covered items [{record.get('start')}, {record.get('stop')}), "
            f"the plan now wants [{expect['start']}, {expect['stop']})"
        )
    if record.get("fingerprint") != expect["fingerprint"]:
        changed = diff_keys(record.get("identity") or {}, expect.get("identity") or {})
        what = ", ".join(changed[:5]) if changed else "the config"
        return f"{shard_dir.name}: config changed since it ran ({what})"
    for rel, digest in (record.get("files") or {}).items():
        path = Path(shard_dir) / rel
        if not path.is_file():
            return f"{shard_dir.name}: {rel} is missing"
        if file_digest(path) != digest:
            return f"{shard_dir.name}: {rel} changed since the marker was written"
    return None


def diff_keys(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two plain dicts (for 'what changed' messages)."""
    keys = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        name = f"{prefix}{key}"
        if isinstance(a, dict) and isinstance(b, dict):
            keys.extend(diff_keys(a, b, name + "."))
        elif a != b:
            keys.append(name)
    return keys
