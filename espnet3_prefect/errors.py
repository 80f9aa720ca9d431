"""Errors users see: one line, naming the key, file or utterance at fault."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

#: errnos of a write refused for want of room: the filesystem is full, or the user's quota is
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class Espnet3PrefectError(Exception):
    """Base class: every error we raise on purpose derives from it."""


class ConfigError(Espnet3PrefectError, ValueError):
    """A config key is missing, unknown, or has a bad value. Raised before anything runs."""


class BadInputError(Espnet3PrefectError, ValueError):
    """An utterance, dataset item or forward() result breaks the contract.

    Retrying cannot fix it, so shard tasks do not retry on it.
    """


class ItemError(Espnet3PrefectError, RuntimeError):
    """forward() raised on one item or batch; the message names it and the original exception.

    ``retryable`` says whether a retry can help (see :func:`is_retryable`); it travels with the
    error when Dask pickles it (a pickled exception loses its ``__cause__``).
    """

    def __init__(self, message: str, retryable: bool = True):
        super().__init__(message, retryable)
        self.message, self.retryable = message, retryable

    def __str__(self) -> str:
        return self.message


class DiskFullError(Espnet3PrefectError, RuntimeError):
    """A write failed for want of space (ENOSPC) or quota (EDQUOT); the message names the path.

    Never retried: a retry a few seconds later meets the same full disk, and each attempt would only
    add lines to the log. The user frees space and re-runs; shards already done are kept.
    """

    retryable = False

    def __init__(self, message: str, path: str | None = None):
        super().__init__(message, path)
        self.message, self.path = message, path

    def __str__(self) -> str:
        return self.message


def no_space(exc: BaseException | None) -> OSError | None:
    """The ENOSPC / EDQUOT ``OSError`` in ``exc``'s cause chain, if there is one."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def free_mb(path: str | Path) -> int | None:
    """MB free on the filesystem holding ``path`` (or its nearest existing parent); None if unknown."""
    path = Path(path)
    for folder in (path, *path.parents):
        try:
            return int(shutil.disk_usage(folder).free // 2**20)
        except OSError:
            continue
    return None


def disk_full(exc: OSError, path: str | Path | None = None, advice: str | None = None) -> DiskFullError:
    """One line for a write refused for want of room: the path that failed (``exc.filename``, else
    ``path``), the space left on its filesystem, and what to do.

    >>> str(disk_full(OSError(28, "No space left on device", "/nonexistent/x"), advice="free space"))[:48]
    'no space left on device writing /nonexistent/x ('
    """
    where = exc.filename if exc.filename is not None else path
    what = "disk quota exceeded" if exc.errno == errno.EDQUOT else "no space left on device"
    free = free_mb(where) if where is not None else None
    room = "" if free is None else f" ({free} MB free on that filesystem)"
    advice = advice or "free space and re-run: shards done so far are kept"
    target = os.fsdecode(where) if where is not None else "(path unknown)"
    return DiskFullError(f"{what} writing {target}{room}; {advice}", None if where is None else str(target))


def named(exc: BaseException, path: str | Path) -> BaseException:
    """``exc`` with ``path`` as its filename when it is an ``OSError`` without one (a failed
    ``write`` or ``close`` does not say which file it was); returns ``exc``, for ``raise``."""
    if isinstance(exc, OSError) and exc.filename is None:
        exc.filename = str(path)
    return exc


class MissingExtraError(Espnet3PrefectError, ImportError):
    """An optional backend package is not installed; the message names the pip extra."""


def one_line(text: str) -> str:
    """Collapse whitespace so a message stays on one line."""
    return " ".join(str(text).split())


def describe(exc: BaseException) -> str:
    """One line for an error: our own errors speak for themselves, others carry their type.

    >>> describe(KeyError("speech")), describe(ConfigError("input_key: missing"))
    ("KeyError: 'speech'", 'input_key: missing')
    """
    return one_line(exc) if isinstance(exc, Espnet3PrefectError) else f"{type(exc).__name__}: {one_line(exc)}"


#: exceptions that say the same input will fail the same way again: never retried
DETERMINISTIC = (
    ConfigError,
    BadInputError,
    KeyError,
    IndexError,
    TypeError,
    ValueError,
    AttributeError,
    NameError,
    AssertionError,
    NotImplementedError,
    ImportError,
    ArithmeticError,
)


def is_retryable(exc: BaseException) -> bool:
    """Whether a retry can help: not for bad config or bad input, nor for errors that are
    deterministic by nature (a missing key, a wrong type or value, ...), wherever they sit in the
    cause chain; yes for the rest (I/O, memory, a flaky device or network, ...). Not for a full disk
    or quota either (ENOSPC, EDQUOT; :class:`DiskFullError`): the retry, seconds later, would meet
    the same full disk, and every attempt of every shard would print its failure.

    >>> is_retryable(OSError("nfs hiccup")), is_retryable(KeyError("speech"))
    (True, False)
    >>> is_retryable(ItemError("item 3: KeyError: 'speech'", retryable=False))
    False
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DETERMINISTIC) or getattr(exc, "retryable", True) is False:
            return False
        if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
            return False
        exc = exc.__cause__ or exc.__context__
    return True
