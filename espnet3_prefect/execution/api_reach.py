"""Whether the run's Prefect server answers just now: the seam between the watch that knows
(:mod:`espnet3_prefect.server.watch`, started by the front doors) and the code below it that talks to
the server (the flows' executor, the progress artifact, the catch-up of the record).

With no watch registered (a flow called from a test, a deployment's flow run) the server counts as up:
every call here returns at once.

>>> server_out(), wait_until_up(0.1)
(False, True)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Protocol

#: how long a run waits for a Prefect server that is not its own once it stops answering (a restart, an
#: upgrade, a host reboot: minutes), unless ``parallel.api_outage_s`` says otherwise
DEFAULT_API_OUTAGE_S = 900.0


class Reach(Protocol):
    """What a watch tells (:class:`espnet3_prefect.server.watch.ServerWatch`)."""

    out_since: float | None
    outage_s: float | None
    #: outages begun so far (each one that the watch said)
    outages_begun: int
    #: the one line, once the watch ended the run because the server stayed away
    reason: str | None

    @property
    def waits(self) -> bool:
        """True when the run waits for its server (not its own) instead of ending."""

    def wait_until_up(self, timeout_s: float | None = None) -> bool:
        """Block while the server is unreachable; True once it answers."""


_current: Reach | None = None


def register(watch: Reach | None) -> Reach | None:
    """Make ``watch`` the one asked from now on (None: none); returns the one it replaces."""
    global _current
    before, _current = _current, watch
    return before


def current() -> Reach | None:
    """The registered watch, or None."""
    return _current


def set_api_outage_s(outage_s: float | None) -> None:
    """``parallel.api_outage_s`` of the stage that starts: how long the run waits for a server that is
    not its own (the run's own server keeps ending the run at once)."""
    watch = _current
    if watch is not None and watch.waits:
        watch.outage_s = outage_s


def wait_until_up(timeout_s: float | None = None) -> bool:
    """Block while the run's server is unreachable (up to ``timeout_s``); True once it answers, at once
    when it does or no watch runs."""
    watch = _current
    return True if watch is None else watch.wait_until_up(timeout_s)


def outages_begun() -> int:
    """How many outages of the run's server the watch has seen begin (0 without a watch): a stage that
    saw one compares it before and after, and then makes its record whole."""
    watch = _current
    return 0 if watch is None else watch.outages_begun


def server_gone() -> str | None:
    """The line the watch ended the run on, once it declared the server gone (else None)."""
    watch = _current
    return None if watch is None else watch.reason


def server_out() -> bool:
    """Whether the run's server is unreachable just now."""
    watch = _current
    return watch is not None and watch.out_since is not None


#: Prefect's client retries of a call that a server not the run's own refuses or turns away (429, 503),
#: each after twice the wait of the one before (2, 4, ... 256 s: ~8.5 min in all, where Prefect's 5 give
#: ~1 min): a lab's server restarted for an upgrade, or busy with other runs, fails no call of the run
#: (one of four 500-shard runs started at once on a stock server failed at its start with a 503)
PATIENT_RETRIES = 8


@contextlib.contextmanager
def patient_client() -> Iterator[None]:
    """:data:`PATIENT_RETRIES` for this process and the workers it starts, unless the user chose
    ``PREFECT_CLIENT_MAX_RETRIES``."""
    if os.environ.get("PREFECT_CLIENT_MAX_RETRIES"):
        yield
        return
    from prefect.settings import PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    os.environ["PREFECT_CLIENT_MAX_RETRIES"] = str(PATIENT_RETRIES)
    try:
        with temporary_settings({PREFECT_CLIENT_MAX_RETRIES: PATIENT_RETRIES}):
            yield
    finally:
        os.environ.pop("PREFECT_CLIENT_MAX_RETRIES", None)
