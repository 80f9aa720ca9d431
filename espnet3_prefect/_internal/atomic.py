"""Atomic publication: write to a temporary name, fsync, rename. Nothing half-written is visible."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_open(path: Path, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open ``path`` for writing; it appears, complete, only when the block exits cleanly.

    >>> import tempfile; d = Path(tempfile.mkdtemp())
    >>> with atomic_open(d / "a.txt") as f: _ = f.write("hi\\n")
    >>> (d / "a.txt").read_text()
    'hi\\n'
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    kwargs = {} if "b" in mode else {"encoding": encoding}
    handle = open(tmp, mode, **kwargs)
    try:
        yield handle
        handle.flush()
        os.fsync(handle.fileno())
        handle.close()
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException as exc:
        if isinstance(exc, OSError) and exc.filename is None:
            exc.filename = str(path)  # a failed write or fsync names no file: name the one we publish
        try:
            handle.close()
        except OSError:
            pass  # flushing what is left fails the same way; the first error is the one to report
        tmp.unlink(missing_ok=True)
        raise


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically."""
    with atomic_open(path) as handle:
        handle.write(text)


def publish_dir(tmp_dir: Path, final_dir: Path) -> None:
    """Replace ``final_dir`` by the finished ``tmp_dir`` (both on one filesystem).

    Any previous ``final_dir`` is moved aside first and removed after, so at every moment
    ``final_dir`` is either absent or a complete directory.
    """
    for child in tmp_dir.iterdir():
        if child.is_file():
            with open(child, "rb") as handle:
                os.fsync(handle.fileno())
    old = None
    if final_dir.exists():
        old = final_dir.with_name(f".{final_dir.name}.old-{uuid.uuid4().hex[:8]}")
        os.replace(final_dir, old)
    os.replace(tmp_dir, final_dir)
    fsync_dir(final_dir.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def file_digest(path: Path) -> dict:
    """sha256 and size of a file, read in 1 MiB blocks."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
            size += len(block)
    return {"sha256": sha.hexdigest(), "bytes": size}
