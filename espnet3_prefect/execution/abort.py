"""How a watch stops the run it watches: one :class:`Abort` per watch, the one way each of them ends a run.

Four watches can decide, from their own thread, that a run cannot go on: the server watch (the run's
server gone, or another past ``parallel.api_outage_s``: :mod:`espnet3_prefect.execution.server_watch`),
the no-worker watch (every Dask worker gone for good: :mod:`espnet3_prefect.execution.worker_watch`),
the job watcher (a batch scheduler that never gives the run a worker:
:mod:`espnet3_prefect.execution.backends.watcher`) and the cancel watch (a cancel from the UI:
:mod:`espnet3_prefect.execution.cancel_watch`). Each fires its abort with the one-line error the run
ends on; the abort runs, once, what ends the wait the flow is blocked in (cancel the Dask futures it
waits on, close its Dask client, interrupt the main thread, cancel a stage's job), and the flow raises
:attr:`Abort.error` or its own error naming the same cause.

The first fire wins; a second fire, and any fire after :meth:`Abort.close` (the watch stopped: the run
is past the block the watch guarded, in its cleanup or done), does nothing. A watch whose last probe
outlives its stop can so never interrupt cleanup, nor change a setting after the watch restored it.

>>> stopped = []
>>> abort = Abort(lambda: stopped.append(True))
>>> abort.fire(RuntimeError("first")), abort.fire(RuntimeError("second")), str(abort.error), stopped
(True, False, 'first', [True])
>>> late = Abort(lambda: stopped.append(True))
>>> late.close(); late.fire(RuntimeError("after its stop")), late.error
(False, None)
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class Abort:
    """One watch's way to end a run: :meth:`fire` once with the error, ``stop`` runs then; see the module."""

    def __init__(self, stop: Callable[[], None] | None = None):
        self._stop = stop
        self._lock = threading.Lock()
        self._closed = False
        #: the error the run ends on, once fired
        self.error: BaseException | None = None
        #: set once fired: waits can end on it
        self.fired = threading.Event()

    def fire(self, error: BaseException, before_stop: Callable[[], None] | None = None) -> bool:
        """End the run with ``error``: True the first time, before :meth:`close`; then ``before_stop``
        (what must hold before the run unwinds, e.g. quieter API retries) and ``stop`` run, in the
        firing thread, under the lock (a :meth:`close` waits for them). False (and nothing done) after."""
        with self._lock:
            if self._closed or self.error is not None:
                return False
            self.error = error
            self.fired.set()
            if before_stop is not None:
                before_stop()
            if self._stop is not None:
                self._stop()
            return True

    def close(self) -> None:
        """The watch stopped: no fire from now on (one under way finishes first)."""
        with self._lock:
            self._closed = True
