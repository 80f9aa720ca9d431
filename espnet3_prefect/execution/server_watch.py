"""The run's Prefect server, watched while a run uses it. The run's own (embedded) server dies with the
run's machine or owner: once it stops answering, the run ends within seconds, on one line that names the
server and says how to finish (a re-run resumes from the done markers), instead of minutes of Prefect's
API retries ending in "Finished in state Running()". A server that is not the run's own
(``PREFECT_API_URL``: a lab's, restarted for an upgrade, or busy) is waited for instead, up to
``parallel.api_outage_s`` (:data:`~espnet3_prefect.execution.api_reach.DEFAULT_API_OUTAGE_S`; ``null``
waits forever): the work goes on, the watch says once that the server is unreachable and once that it
is back, the code that talks to the server asks :mod:`~espnet3_prefect.execution.api_reach` whether to
wait, and what the server missed is sent when it answers (:mod:`espnet3_prefect.execution.catch_up`).
Only past the limit does the run end, on the same one line.

Measured on 2 cores (a 40-shard toy run, the embedded server SIGKILLed a few seconds in): before the
watch, 163-257 s to exit 1 on ``ConnectError``; with it, the line a few seconds after the kill, the
run's Dask cluster closed, exit 1 (``tests/integration/test_server_faults.py``).

The watch asks the server's ``/health`` every ``interval_s``. A refused connection (nothing listens:
the process is gone) counts at once; a server that answers nothing (busy, or hung) counts only once
it has been silent for ``silent_s``, since a loaded server can be slow without being gone. After
``refusals`` refusals in a row, or ``silent_s`` of silence, the watch records why
(:attr:`ServerWatch.reason`) and interrupts the thread that opened it (the main thread: the flow runs
there), which unwinds like Ctrl-C: the run's cluster closes, finished shards stay done. The front
doors open the watch (:func:`espnet3_prefect.server.watch.watching`) and turn that interruption into
:class:`ServerGoneError` (``cli`` prints it and exits 1); a deployment's flow run, which no front door
starts, opens its own (:func:`deployment_watch`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import ssl
import threading
import time
from collections.abc import Iterator

from espnet3_prefect.errors import Espnet3PrefectError
from espnet3_prefect.execution import api_reach
from espnet3_prefect.execution.abort import Abort

log = logging.getLogger("espnet3_prefect")


class ServerGoneError(Espnet3PrefectError, RuntimeError):
    """The Prefect server a run reports to stopped answering mid-run; the message says how to finish."""


def probe(api_url: str, timeout_s: float, cafile: str | None) -> str:
    """``"up"`` (it answers), ``"busy"`` (it answers 429 or 503: there, but turning work away),
    ``"refused"`` (nothing listens there) or ``"silent"`` (no answer in time, or no route to it)."""
    import urllib.error
    import urllib.request

    # verified against ``cafile`` (None: the system's authorities), never unverified
    context = ssl.create_default_context(cafile=cafile) if api_url.startswith("https://") else None
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout_s, context=context):
            return "up"
    except urllib.error.HTTPError as exc:
        return "busy" if exc.code in (429, 503) else "up"  # else an auth wall, a proxy: the server is there
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


#: Prefect's loggers that report each event or log batch an unreachable server could not take
NOISY_WHILE_OUT = ("prefect.events.clients", "prefect._internal.concurrency")


class ServerWatch:
    """Watch ``api_url`` from a daemon thread until :meth:`stop`; see the module's docstring.

    ``what`` names the server in the line (``the run's Prefect server (pid 123)``); ``rerun`` is the
    command that finishes the run, when the caller knows it. ``outage_s``: how long the run waits for
    a server that stopped answering; ``0`` (the run's own server) ends it at once, once ``refusals``
    refusals in a row or ``silent_s`` of silence say it is gone; ``None`` waits forever.

    A server that is not the run's own is *unreachable* after the same evidence (or ``refusals``
    busy answers in a row); from then on :attr:`out_since` is set, :meth:`wait_until_up` blocks,
    and the run ends only once the first failed probe is ``outage_s`` old.
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
        outage_s: float | None = 0.0,
    ):
        self.api_url, self.what, self.rerun, self.cafile = api_url, what, rerun, cafile
        self.interval_s, self.refusals, self.silent_s = interval_s, refusals, silent_s
        self.outage_s = outage_s
        self.reason: str | None = None  # the line, once this watch declared the server gone
        #: wall-clock time (``time.time()``) of the first failed probe of an outage, while it lasts
        self.out_since: float | None = None
        #: outages this watch saw end: ``(since, seconds)`` each
        self.outages: list[tuple[float, float]] = []
        self.outages_begun = 0
        self._before = None
        #: how the watch ends the run, once, and never after :meth:`stop` (:mod:`~espnet3_prefect.execution.abort`)
        self.abort = Abort(self._interrupt)
        self._up = threading.Event()
        self._up.set()
        self._stop = threading.Event()
        self._target = threading.current_thread()
        self._client_settings, self._saved_retries = _client_settings(), None
        self._thread = threading.Thread(target=self._watch, name="espnet3-prefect-server-watch", daemon=True)

    @property
    def waits(self) -> bool:
        """Whether this watch waits for the server (not the run's own) rather than ending the run."""
        return self.outage_s is None or self.outage_s > 0

    def start(self) -> ServerWatch:
        self._before = api_reach.register(self)
        for name in NOISY_WHILE_OUT:
            logging.getLogger(name).addFilter(self._quiet_while_out)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.abort.close()  # from here on the watch ends nothing (a fire under way finishes first)
        self._stop.set()
        self._up.set()
        if api_reach.current() is self:
            api_reach.register(self._before)
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._saved_retries is not None:
            self._client_settings.max_retries = self._saved_retries
        logging.getLogger("prefect.flow_runs").removeFilter(self._silenced)
        for name in NOISY_WHILE_OUT:
            logging.getLogger(name).removeFilter(self._quiet_while_out)
        if self.out_since is not None:
            logging.raiseExceptions = True

    def _quiet_while_out(self, record: logging.LogRecord) -> bool:
        """While the server is unreachable, Prefect's clients say so on every event they keep for later
        (a line with the whole event, at ERROR): the watch's one line says it instead."""
        return self.out_since is None

    def wait_until_up(self, timeout_s: float | None = None) -> bool:
        """Block while the server is unreachable (not past ``timeout_s``); True once it answers (at once
        when it does), False when the watch stopped or declared it gone meanwhile, or on the timeout."""
        if self._up.is_set():
            return self.reason is None
        self._up.wait(timeout_s)
        return self._up.is_set() and self.reason is None and not self._stop.is_set()

    def _silenced(self, record: logging.LogRecord) -> bool:
        """Once the server is gone, the flow run's own log lines say nothing the line does not."""
        return self.reason is None

    def _watch(self) -> None:
        refused = busy = 0
        failing_since = silent_since = None  # monotonic times
        failing_wall = None
        while not self._stop.wait(self.interval_s):
            state = probe(self.api_url, timeout_s=min(10.0, self.silent_s), cafile=self.cafile)
            if self._stop.is_set():
                return
            if state == "busy" and not self.waits:
                state = "up"  # the run's own server, answering: there, whatever it says
            if state == "up":
                if self.out_since is not None:
                    self._back()
                refused = busy = 0
                failing_since = silent_since = failing_wall = None
                continue
            now = time.monotonic()
            if failing_since is None:
                failing_since, failing_wall = now, time.time()
            refused = refused + 1 if state == "refused" else 0
            busy = busy + 1 if state == "busy" else 0
            silent_since = (silent_since or now) if state == "silent" else None
            how = {"refused": "connection refused", "busy": "it answers 503 or 429", "silent": "no answer"}[state]
            evidence = refused >= self.refusals or busy >= self.refusals
            evidence = evidence or (silent_since is not None and now - silent_since >= self.silent_s)
            if not self.waits:
                if refused >= self.refusals:
                    return self._declare_gone("stopped (connection refused)")
                if silent_since is not None and now - silent_since >= self.silent_s:
                    return self._declare_gone(f"has not answered for {self.silent_s:.0f} s")
                continue
            if evidence and self.out_since is None:
                self._out(failing_wall, how, "busy" if state == "busy" else "unreachable")
            if self.outage_s is not None and self.out_since is not None and now - failing_since >= self.outage_s:
                since = time.strftime("%H:%M:%S", time.localtime(failing_wall))
                what = "busy" if state == "busy" else "unreachable"
                return self._declare_gone(
                    f"has been {what} since {since} ({how}), longer than parallel.api_outage_s={self.outage_s:g}",
                    mid_run=False,
                )

    def _out(self, since: float, how: str, what: str) -> None:
        self.out_since = since
        self.outages_begun += 1
        self._up.clear()
        # Prefect's log handler writes "--- Error logging to API ---" on stderr for each batch it drops
        # (the lines stay in the stage's log files), as the logging module does for a handler error
        logging.raiseExceptions = False
        limit = "for as long as it takes" if self.outage_s is None else f"up to {self.outage_s:g} s"
        log.warning(
            "%s at %s is %s since %s (%s); the run carries on and waits for it %s "
            "(parallel.api_outage_s); what it misses is sent once it answers",
            self.what,
            self.api_url,
            what,
            time.strftime("%H:%M:%S", time.localtime(since)),
            how,
            limit,
        )

    def _back(self) -> None:
        seconds = time.time() - self.out_since
        self.outages.append((self.out_since, seconds))
        log.warning(
            "%s at %s answers again (after %.0f s); the run sends it what it missed", self.what, self.api_url, seconds
        )
        self.out_since = None
        logging.raiseExceptions = True
        self._up.set()

    def _declare_gone(self, how: str, *, mid_run: bool = True) -> None:
        where = " mid-run" if mid_run else ""
        line = f"{self.what} at {self.api_url} {how}{where}; the shards finished so far are kept on disk"
        line += f"; to finish the rest, re-run: {self.rerun}" if self.rerun else "; a re-run resumes from them"
        self.abort.fire(ServerGoneError(line), before_stop=lambda: self._gone(line))

    def _gone(self, line: str) -> None:
        """The verdict, once, before the run unwinds (under the abort's lock: never after :meth:`stop`)."""
        self.reason = line
        self._up.set()  # waiters wake, and see the verdict
        log.error("%s", line)
        # the engine's last words about a run it could not report ("Finished in state Running()")
        logging.getLogger("prefect.flow_runs").addFilter(self._silenced)
        # What Prefect still sends on the way out (the flow run's Crashed state) cannot arrive: one
        # try each instead of its retries with back-off (minutes, measured), until the watch stops.
        if self._client_settings is not None:
            self._saved_retries = self._client_settings.max_retries
            self._client_settings.max_retries = 0

    def _interrupt(self) -> None:
        """The abort's stop: the thread that opened the watch (the main thread: the flow runs there)
        unwinds as on Ctrl-C; a real signal, not ``_thread.interrupt_main``: it also wakes a main
        thread blocked in a wait. From another thread the line is all the watch can do."""
        if self._target is threading.main_thread():
            signal.pthread_kill(self._target.ident, signal.SIGINT)


@contextlib.contextmanager
def deployment_watch() -> Iterator[ServerWatch | None]:
    """In a deployment's flow run (a Prefect worker started this process: no front door of ours opened a
    watch), the server of ``PREFECT_API_URL`` is watched as the front doors watch a server that is not
    the run's own: waited for, up to ``parallel.api_outage_s``, with the client's patient retries
    (:func:`~espnet3_prefect.execution.api_reach.patient_client`); past the limit the run ends as
    :class:`ServerGoneError`. Nothing is opened when a watch already runs (a front door's, or the parent
    flow's), outside a deployment, or off the main thread."""
    url = os.environ.get("PREFECT_API_URL")
    if api_reach.current() is not None or not url or threading.current_thread() is not threading.main_thread():
        yield None
        return
    from prefect.runtime import deployment

    if not deployment.id:
        yield None
        return
    with api_reach.patient_client():
        watch = ServerWatch(
            url,
            what="the Prefect server of this deployment's flow run",
            cafile=os.environ.get("PREFECT_API_SSL_CERT_FILE"),
            outage_s=api_reach.DEFAULT_API_OUTAGE_S,
        ).start()
        try:
            yield watch
        except (Exception, KeyboardInterrupt):
            if watch.reason is not None:
                raise ServerGoneError(watch.reason) from None
            raise
        finally:
            watch.stop()
