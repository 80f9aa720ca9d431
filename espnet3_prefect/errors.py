"""Errors users see: one line, naming the key, file or utterance at fault."""

from __future__ import annotations


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
    cause chain; yes for the rest (I/O, memory, a flaky device or network, ...).

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
        exc = exc.__cause__ or exc.__context__
    return True
