"""The streamed, atomic concatenation of shard files into one (what a runner's ``merge`` does with
``<field>.scp`` files): :func:`concat_files`, used by our runners, the merge step and recipes."""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from espnet3_prefect._internal.atomic import atomic_open


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
