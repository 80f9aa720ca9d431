"""The front doors' watch of the run's Prefect server (:mod:`espnet3_prefect.execution.server_watch`
holds the watch itself): :func:`watching` opens it around a run and turns its interruption into
:class:`ServerGoneError`."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from espnet3_prefect.execution.server_watch import ServerGoneError, ServerWatch, probe

__all__ = ["ServerGoneError", "ServerWatch", "probe", "watching"]


@contextlib.contextmanager
def watching(
    api_url: str, *, what: str, rerun: str | None = None, cafile: str | None = None, outage_s: float | None = 0.0
) -> Iterator[ServerWatch]:
    """Watch ``api_url`` while the block runs; once the watch declared the server gone, whatever
    leaves the block (its interruption, or the error of an API call that failed first) leaves it as
    :class:`ServerGoneError`. Opened from another thread than the main one, the watch only logs the
    line (it cannot interrupt that thread)."""
    watch = ServerWatch(api_url, what=what, rerun=rerun, cafile=cafile, outage_s=outage_s)
    on_main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if on_main else None
    if on_main:
        # The watch's interrupt is its own whatever handler is installed: dask_jobqueue installs one
        # at import time that exits silently (``sys.exit()``), which would turn the watch's line into
        # a SystemExit (found in CI: a test earlier in the same process had imported it). A Ctrl-C
        # that is not the watch's goes to the handler that was there; an ignored one stays ignored.
        def the_watch_first(signum, frame):
            if watch.reason is not None:
                raise KeyboardInterrupt
            if callable(before):
                return before(signum, frame)
            if before == signal.SIG_DFL:
                signal.default_int_handler(signum, frame)

        signal.signal(signal.SIGINT, the_watch_first)
    watch.start()
    try:
        yield watch
    except (Exception, KeyboardInterrupt, SystemExit):
        if watch.reason is not None:
            raise ServerGoneError(watch.reason) from None
        raise
    finally:
        watch.stop()
        if on_main and signal.getsignal(signal.SIGINT) is the_watch_first:
            signal.signal(signal.SIGINT, before if before is not None else signal.default_int_handler)
