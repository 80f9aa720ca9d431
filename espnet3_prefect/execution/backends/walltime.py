"""Walltimes as each scheduler reads them, and when workers retire before theirs."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.execution.backends.base import option_error

_SCALE = {"H": 3600, "M": 60, "S": 1}
_BARE = {"seconds": "S", "minutes": "M", "hours": "H"}


@dataclass(frozen=True)
class WalltimeFormat:
    """How one scheduler reads a walltime: what a bare number means, what 2 and 3 fields mean
    (None: not accepted), the formats to show in errors, and SLURM's ``D-HH[:MM[:SS]]``.

    >>> WalltimeFormat("minutes", ("M:S", "H:M:S"), "HH:MM:SS", days=True).seconds("1-02:00:00")
    93600
    >>> WalltimeFormat("minutes", ("H:M", None), "HH:MM").seconds("01:30")
    5400
    """

    bare: str
    layouts: tuple[str | None, str | None]
    shown: str
    days: bool = False

    def seconds(self, value: Any, env: str = "") -> int:
        """Seconds in ``value``; a one-line error naming ``parallel.options.walltime`` otherwise."""
        if not isinstance(value, str):
            hint = " (YAML reads an unquoted 1:00:00 as a number: quote it)" if isinstance(value, int) else ""
            raise option_error("walltime", f"must be a string like {self.shown!r}, got {value!r}{hint}")
        text = value.strip()
        days = 0
        if self.days and re.fullmatch(r"\d+-[\d:]+", text):
            day_text, text = text.split("-", 1)
            days = int(day_text)
            fields = text.split(":")
            layout = ("H", "H:M", "H:M:S")[len(fields) - 1] if len(fields) <= 3 else None
        else:
            fields = text.split(":")
            if len(fields) == 1:
                layout = _BARE[self.bare]
            else:
                layout = self.layouts[len(fields) - 2] if len(fields) <= 3 else None
        if layout is None or not all(f.isdigit() for f in fields):
            raise option_error(
                "walltime", f"cannot read {value!r} as a walltime for env {env!r} (expected {self.shown})"
            )
        total = days * 86400 + sum(int(f) * _SCALE[u] for f, u in zip(fields, layout.split(":")))
        if total <= 0:
            raise option_error("walltime", f"must be longer than zero, got {value!r}")
        return total


@dataclass(frozen=True)
class Lifetime:
    """When workers retire: uniformly in ``[seconds - stagger_s, seconds + stagger_s]``."""

    seconds: int
    stagger_s: int
    margin_s: int

    def worker_args(self) -> list[str]:
        return ["--lifetime", f"{self.seconds}s", "--lifetime-stagger", f"{self.stagger_s}s"]


def default_margin_s(walltime_s: int) -> int:
    """5 % of the walltime, at least 1 minute, at most 10 minutes, and never over a quarter of it.

    >>> default_margin_s(60), default_margin_s(1800), default_margin_s(7200), default_margin_s(86400)
    (15, 90, 360, 600)
    """
    return int(min(600, max(60, walltime_s / 20), walltime_s / 4))


def worker_lifetime(walltime_s: int, margin_s: float | None = None) -> Lifetime:
    """Retire workers at the latest ``margin_s`` before the walltime, staggered so they do not all go at once.

    >>> worker_lifetime(3600)
    Lifetime(seconds=3240, stagger_s=180, margin_s=180)
    """
    margin = default_margin_s(walltime_s) if margin_s is None else int(margin_s)
    stagger = int(min(300, walltime_s / 20))
    lifetime = walltime_s - margin - stagger
    if lifetime - stagger < 10:
        raise ConfigError(
            f"parallel.lifetime_margin_s: {margin_s} s leaves workers no lifetime within a walltime of "
            f"{walltime_s} s (needs margin + 2 x {stagger} s stagger + 10 s)"
        )
    return Lifetime(seconds=lifetime, stagger_s=stagger, margin_s=margin)
