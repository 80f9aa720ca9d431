"""The run's Prefect server, watched while a run uses it: a server that stops mid-run ends the run
within seconds, on one line that names the server and says how to finish (a re-run resumes from the
done markers), instead of minutes of Prefect's API retries ending in "Finished in state Running()".

Measured on 2 cores (a 40-shard toy run, the embedded server SIGKILLed a few seconds in): before the
watch, 163-257 s to exit 1 on ``ConnectError``; with it, the line a few seconds after the kill, the
run's Dask cluster closed, exit 1 (``tests/integration/test_server_faults.py``).

The watch asks the server's ``/health`` every ``interval_s``. A refused connection (nothing listens:
the process is gone) counts at once; a server that answers nothing (busy, or hung) counts only once
it has been silent for ``silent_s``, since a loaded server can be slow without being gone. After
``refusals`` refusals in a row, or ``silent_s`` of silence, the watch records why
(:attr:`ServerWatch.reason`) and interrupts the thread that opened it (the main thread: the flow runs
there), which unwinds like Ctrl-C: the run's cluster closes, finished shards stay done. The front
doors turn that interruption into :class:`ServerGoneError` (``cli`` prints it and exits 1).
"""

from __future__ import annotations

import contextlib
import logging
import signal
import ssl
import threading
import time
from collections.abc import Iterator

from espnet3_prefect.errors import Espnet3PrefectError

log = logging.getLogger("espnet3_prefect")


class ServerGoneError(Espnet3PrefectError, RuntimeError):
    """The Prefect server a run reports to stopped answering mid-run; the message says how to finish."""


def probe(api_url: str, timeout_s: float, cafile: str | None) -> str:
    """``"up"`` (it answers, whatever it says), ``"refused"`` (nothing listens there) or ``"silent"``
    (no answer in time, or no route to it)."""
    import urllib.error
    import urllib.request

    from espnet3_prefect.server.https import client_context

    context = client_context(cafile) if api_url.startswith("https://") else None
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout_s, context=context):
            return "up"
    except urllib.error.HTTPError:
        return "up"  # it answers (an auth wall, a proxy): the server is there
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLError):
            return "up"  # it answers TLS: a certificate we cannot verify is not a server gone
        refused = isinstance(exc.reason, ConnectionRefusedError | ConnectionResetError)
        return "refused" if refused else "silent"
    except (ConnectionRefusedError, ConnectionResetError):
        return "refused"
    except OSError:
        return "silent"


def _client_settings():
    """The Prefect client settings of the calling thread's settings context: the object whose
    ``max_retries`` every API call made in that context reads at the time of the call."""
    from prefect.context import SettingsContext

    context = SettingsContext.get()
    return context.settings.client if context is not None else None


class ServerWatch:
    """Watch ``api_url`` from a daemon thread until :meth:`stop`; see the module's docstring.

    ``what`` names the server in the line (``the run's Prefect server (pid 123)``); ``rerun`` is the
    command that finishes the run, when the caller knows it.
    """

    def __init__(
        self,
        api_url: str,
        *,
        what: str,
        rerun: str | None = None,
        cafile: str | None = None,
        interval_s: float = 1.0,
        refusals: int = 3,
        silent_s: float = 60.0,
    ):
        self.api_url, self.what, self.rerun, self.cafile = api_url, what, rerun, cafile
        self.interval_s, self.refusals, self.silent_s = interval_s, refusals, silent_s
        self.reason: str | None = None  # the line, once this watch declared the server gone
        self._stop = threading.Event()
        self._target = threading.current_thread()
        self._client_settings, self._saved_retries = _client_settings(), None
        self._thread = threading.Thread(target=self._watch, name="espnet3-prefect-server-watch", daemon=True)

    def start(self) -> ServerWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._saved_retries is not None:
            self._client_settings.max_retries = self._saved_retries
        logging.getLogger("prefect.flow_runs").removeFilter(self._silenced)

    def _silenced(self, record: logging.LogRecord) -> bool:
        """Once the server is gone, the flow run's own log lines say nothing the line does not."""
        return self.reason is None

    def _watch(self) -> None:
        refused, silent_since = 0, None
        while not self._stop.wait(self.interval_s):
            state = probe(self.api_url, timeout_s=min(10.0, self.silent_s), cafile=self.cafile)
            if self._stop.is_set():
                return
            if state == "up":
                refused, silent_since = 0, None
                continue
            now = time.monotonic()
            if state == "refused":
                refused += 1
            else:
                silent_since = silent_since or now
            if refused >= self.refusals:
                return self._declare_gone("stopped (connection refused)")
            if silent_since is not None and now - silent_since >= self.silent_s:
                return self._declare_gone(f"has not answered for {self.silent_s:.0f} s")

    def _declare_gone(self, how: str) -> None:
        line = f"{self.what} at {self.api_url} {how} mid-run; the shards finished so far are kept on disk"
        line += f"; to finish the rest, re-run: {self.rerun}" if self.rerun else "; a re-run resumes from them"
        self.reason = line
        log.error("%s", line)
        # the engine's last words about a run it could not report ("Finished in state Running()")
        logging.getLogger("prefect.flow_runs").addFilter(self._silenced)
        # What Prefect still sends on the way out (the flow run's Crashed state) cannot arrive: one
        # try each instead of its retries with back-off (minutes, measured), until the watch stops.
        if self._client_settings is not None:
            self._saved_retries = self._client_settings.max_retries
            self._client_settings.max_retries = 0
        if self._target is threading.main_thread():
            # a real signal, not _thread.interrupt_main: it also wakes a main thread blocked in a wait
            signal.pthread_kill(self._target.ident, signal.SIGINT)


@contextlib.contextmanager
def watching(api_url: str, *, what: str, rerun: str | None = None, cafile: str | None = None) -> Iterator[ServerWatch]:
    """Watch ``api_url`` while the block runs; once the watch declared the server gone, whatever
    leaves the block (its interruption, or the error of an API call that failed first) leaves it as
    :class:`ServerGoneError`. Opened from another thread than the main one, the watch only logs the
    line (it cannot interrupt that thread)."""
    watch = ServerWatch(api_url, what=what, rerun=rerun, cafile=cafile)
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
