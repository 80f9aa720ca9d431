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
    """forward() raised on one item; the message names the item and the original exception.

    Retried like any runtime error (it may be transient), unlike :class:`BadInputError`.
    """


class MissingExtraError(Espnet3PrefectError, ImportError):
    """An optional backend package is not installed; the message names the pip extra."""


def one_line(text: str) -> str:
    """Collapse whitespace so a message stays on one line."""
    return " ".join(str(text).split())
