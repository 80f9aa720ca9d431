"""The SCP text format we write: ``<utt_id> <value>\\n``, UTF-8, one line per utterance.

utt_ids are non-empty and contain no whitespace or '/' (and are not '.' or '..'); values may hold
any text but line breaks, which are rejected at write time with the utterance named. The value is
everything after the first space, kept verbatim: leading/trailing spaces and tabs survive a
round trip through :func:`read_scp` (readers that split on any whitespace run would lose them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator


def iter_scp(path: str | Path) -> Iterator[tuple[str, str]]:
    """Yield ``(utt_id, value)`` pairs of an SCP file, streaming.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "a.scp")
    >>> _ = open(p, "w", encoding="utf-8").write("u1  two spaces \\nu2 \\n")
    >>> list(iter_scp(p))
    [('u1', ' two spaces '), ('u2', '')]
    """
    with open(path, encoding="utf-8", newline="\n") as handle:
        for number, line in enumerate(handle, 1):
            line = line[:-1] if line.endswith("\n") else line
            utt, sep, value = line.partition(" ")
            if not utt:
                raise ValueError(f"{path}:{number}: line has no utt_id")
            yield utt, value


def read_scp(path: str | Path) -> dict[str, str]:
    """All pairs of an SCP file as a dict (for small files; use :func:`iter_scp` for large ones)."""
    return dict(iter_scp(path))
