"""The SCP text format: ``<utt_id> <value>\\n``, UTF-8, one line per utterance, read streaming.

What ``infer`` writes: utt_ids are non-empty and contain no whitespace or '/' (nor are '.' or
'..'); values may hold any text but line breaks, which are rejected at write time naming the
utterance and field. The value is everything after the first space, kept verbatim:
:func:`read_scp` / :func:`iter_scp_verbatim` give it back exactly (leading/trailing spaces, tabs,
any UTF-8). :func:`iter_scp` is the reader the metrics stage uses, with ESPnet3's rule: each
line is stripped, blank lines are skipped, the utt_id ends at the first whitespace and the value
(the rest) is stripped too.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from itertools import zip_longest
from pathlib import Path

from espnet3_prefect.errors import BadInputError


def iter_scp(path: str | os.PathLike) -> Iterator[tuple[int, str, str]]:
    """Yield ``(line_number, utt_id, value)``; the value is ``""`` for ``utt_id`` alone (empty hyp).

    Blank lines are skipped; the value keeps its inner spacing (ESPnet3's ``BaseMetric`` reading).

    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "hyp.scp"
    >>> _ = p.write_text("u1 a  b \\nu2 \\n\\n  u3\\n")
    >>> list(iter_scp(p))
    [(1, 'u1', 'a  b'), (2, 'u2', ''), (4, 'u3', '')]
    """
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            parts = line.strip().split(maxsplit=1)
            if parts:
                yield number, parts[0], parts[1].strip() if len(parts) > 1 else ""


def plain_utt_id(value: object, where: str = "utt_id") -> str:
    """``str(value)`` when it can head an SCP line and name a file (no whitespace, '/', '\\\\', '.', '..').

    >>> plain_utt_id(7)
    '7'
    >>> plain_utt_id("a b")  # doctest: +NORMALIZE_WHITESPACE
    Traceback (most recent call last):
    espnet3_prefect.errors.BadInputError: utt_id 'a b': must be a plain token (no whitespace, '/' or '\\\\', not '.'
    or '..')
    """
    name = str(value)
    if not name or name in (".", "..") or "/" in name or "\\" in name or any(c.isspace() for c in name):
        raise BadInputError(f"{where} {name!r}: must be a plain token (no whitespace, '/' or '\\\\', not '.' or '..')")
    return name


def iter_scp_verbatim(path: str | os.PathLike) -> Iterator[tuple[str, str]]:
    """Yield ``(utt_id, value)`` exactly as written: the value is everything after the first space.

    >>> import tempfile; p = Path(tempfile.mkdtemp()) / "a.scp"
    >>> _ = p.write_text("u1  two spaces \\nu2 \\n", encoding="utf-8")
    >>> list(iter_scp_verbatim(p))
    [('u1', ' two spaces '), ('u2', '')]
    """
    with open(path, encoding="utf-8", newline="\n") as handle:
        for number, line in enumerate(handle, 1):
            line = line[:-1] if line.endswith("\n") else line
            utt, _, value = line.partition(" ")
            if not utt:
                raise BadInputError(f"{path}:{number}: line has no utt_id")
            yield utt, value


def read_scp(path: str | os.PathLike) -> dict[str, str]:
    """All pairs of an SCP file, values verbatim (for small files; else :func:`iter_scp_verbatim`)."""
    return dict(iter_scp_verbatim(path))


class ScpField(os.PathLike):
    """One input of a metric: a path to an SCP file that also reads like ESPnet3's list of values.

    ``os.fspath(field)`` / ``Path(field)`` give the file; iterating yields the values in file order
    (streamed); ``items()`` yields ``(utt_id, value)``; ``len()`` counts lines. Indexing
    (``field[3]``) loads the values on first use, for metrics written against ESPnet3's
    list-of-strings contract; streaming metrics never pay for it.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self._loaded: list[str] | None = None

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def __repr__(self) -> str:
        return f"ScpField({str(self.path)!r})"

    @property
    def name(self) -> str:
        return self.path.name

    def open(self, mode: str = "r", encoding: str = "utf-8"):
        return open(self.path, mode, encoding=encoding)

    def items(self) -> Iterator[tuple[str, str]]:
        for _, utt, value in iter_scp(self.path):
            yield utt, value

    def keys(self) -> Iterator[str]:
        for utt, _ in self.items():
            yield utt

    def __iter__(self) -> Iterator[str]:
        for _, value in self.items():
            yield value

    def __len__(self) -> int:
        return sum(1 for _ in iter_scp(self.path))

    def __getitem__(self, index):
        if self._loaded is None:
            self._loaded = list(self)
        return self._loaded[index]


def iter_aligned(paths: Mapping[str, str | os.PathLike]) -> Iterator[tuple[str, list[str]]]:
    """Zip several SCP files line by line; yield ``(utt_id, [value per file])``.

    Raises :class:`BadInputError` (one line) at the first utt_id that differs or the first file
    that ends early, naming both files, the line and the utt_ids.
    """
    names = list(paths)
    if not names:
        return
    files = [Path(paths[n]) for n in names]
    streams = [iter_scp(f) for f in files]
    count = 0
    for rows in zip_longest(*streams):
        first = rows[0]
        for path, row in zip(files, rows):
            if row is None:
                other = next(r for r in rows if r is not None)
                raise BadInputError(
                    f"{path}: ends after {count} utterances but {files[rows.index(other)].name} continues with "
                    f"{other[1]!r} (line {other[0]}); inputs {', '.join(names)} must list the same utt_ids"
                )
        for path, row in zip(files[1:], rows[1:]):
            if row[1] != first[1]:
                raise BadInputError(
                    f"{path} line {row[0]}: utt_id {row[1]!r} where {files[0]} line {first[0]} has {first[1]!r}; "
                    f"inputs {', '.join(names)} must list the same utt_ids in the same order"
                )
        count += 1
        yield first[1], [row[2] for row in rows]


def count_aligned(paths: Mapping[str, str | os.PathLike]) -> int:
    """Check :func:`iter_aligned` over the whole files; return the number of utterances."""
    return sum(1 for _ in iter_aligned(paths))


def chunked(iterable, size: int) -> Iterator[list]:
    """Lists of up to ``size`` items, in order (bounded memory for large test sets)."""
    chunk: list = []
    for item in iterable:
        chunk.append(item)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
