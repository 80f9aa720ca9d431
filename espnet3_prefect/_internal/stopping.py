"""Stopping one process: a first signal, a wait, SIGKILL as the last resort (:func:`stop_process`), and
the stop timeouts of a run's Prefect server, declared once in the order they must keep
(:data:`SERVER_STOP`).

It imports only the standard library and psutil, nothing of the package: the server's guard
(:mod:`espnet3_prefect.server.guard`), which must not import the package (it would import Prefect),
loads this one file by its path. :mod:`espnet3_prefect._internal.proc` offers the same names.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass

import psutil

#: how long a process may take to go once SIGKILLed (the kernel frees its memory first)
KILL_WAIT_S = 5.0
#: how often a wait looks whether a process is gone
POLL_S = 0.1


@dataclass(frozen=True)
class ServerStopTimeouts:
    """How long each part of a Prefect server's stop may take, in seconds, each inside the next.

    ``drain_s``: the server's own stop (SIGTERM) waits this long at most for its services' queues
    (:mod:`espnet3_prefect.server.serve`, ``$ESPNET3_PREFECT_DRAIN_TIMEOUT_S`` overrides it);
    ``guard_grace_s``: the guard waits this long for the server to stop before SIGKILL
    (:mod:`espnet3_prefect.server.guard`); ``stop_s``: a run or ``espnet3-prefect`` waits this long
    for the server (or its guard) before SIGKILL (:mod:`espnet3_prefect.server.process`). Were they out
    of order, a server would be killed while it still writes what its services hold.

    >>> ServerStopTimeouts(drain_s=26.0)
    Traceback (most recent call last):
    ...
    ValueError: server stop timeouts out of order: need drain_s (26.0) < guard_grace_s (25.0) < stop_s (30.0)
    """

    drain_s: float = 20.0
    guard_grace_s: float = 25.0
    stop_s: float = 30.0

    def __post_init__(self) -> None:
        if not 0 <= self.drain_s < self.guard_grace_s < self.stop_s:
            raise ValueError(
                f"server stop timeouts out of order: need drain_s ({self.drain_s}) < guard_grace_s "
                f"({self.guard_grace_s}) < stop_s ({self.stop_s})"
            )


#: the server stop timeouts every module reads (checked in order on import: :class:`ServerStopTimeouts`)
SERVER_STOP = ServerStopTimeouts()


def stop_process(
    pid: int | psutil.Process,
    timeout_s: float,
    *,
    first: int | None = signal.SIGTERM,
    group: bool = False,
    kill_wait_s: float = KILL_WAIT_S,
) -> bool:
    """Stop process ``pid``: signal ``first`` (None: none, it was told already), wait up to ``timeout_s``
    for it to go, then SIGKILL and wait up to ``kill_wait_s``. ``group``: both signals go to the process
    group ``pid`` leads (``start_new_session``), or to ``pid`` alone when it leads none; only ``pid``
    is waited for. A :class:`psutil.Process` (taken before the pid could be reused) may stand for it.

    True when it is gone (a child of ours reaped; a zombie counts as gone), also when it was gone
    already; False when it still runs: it outlived SIGKILL, or is not ours to signal.
    """
    if isinstance(pid, psutil.Process):
        proc = pid
    elif pid <= 0:  # os.killpg(0) would signal our own group
        raise ValueError(f"not a process id: {pid}")
    else:
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            return True
    for sig, wait_s in ((first, timeout_s), (signal.SIGKILL, kill_wait_s)):
        if not proc_running(proc):
            return _reaped(proc, kill_wait_s)
        if sig is not None and not _send(proc, sig, group):
            return not proc_running(proc)
        if not wait_gone([proc], wait_s):
            return _reaped(proc, kill_wait_s)
    return False


def _reaped(proc: psutil.Process, timeout_s: float) -> bool:
    """True, once a zombie has been reaped: here when it is our child, else by its parent (init, within
    milliseconds), or after ``timeout_s``: callers that then ask whether the pid exists
    (``servers --stop``, the tests) see it gone, as they did when the stop waited on the pid itself."""
    deadline = time.monotonic() + timeout_s
    # is_running: a zombie still counts, a process that took its pid since does not
    while proc.is_running():
        with contextlib.suppress(psutil.TimeoutExpired, psutil.NoSuchProcess, ChildProcessError):
            proc.wait(0)  # a child of ours that became a zombie since it was last looked at: reaped here
        if not proc.is_running() or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)
    return True


def _send(proc: psutil.Process, sig: int, group: bool) -> bool:
    """Signal ``proc`` (``group``: the group it leads); False when we may not."""
    if group:
        try:
            os.killpg(proc.pid, sig)
            return True
        except ProcessLookupError:  # it leads no group: the process alone
            pass
        except PermissionError:
            return False
    try:
        proc.send_signal(sig)  # not when its pid was taken by another process since
    except psutil.NoSuchProcess:
        pass
    except psutil.AccessDenied:
        return False
    return True


def wait_gone(procs: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` until none of ``procs`` runs (:func:`proc_running`); those still running.
    Not :func:`psutil.wait_procs`: it waits for a zombie that is not our child as if it ran."""
    deadline = time.monotonic() + timeout_s
    left = [p for p in procs if proc_running(p)]
    while left and time.monotonic() < deadline:
        time.sleep(POLL_S)
        left = [p for p in left if proc_running(p)]
    return left


def proc_running(proc: psutil.Process) -> bool:
    """Alive and not a zombie (a child of ours that exited is reaped on the way)."""
    try:
        if not proc.is_running():  # gone, or its pid taken by a process started since
            return False
        with contextlib.suppress(psutil.TimeoutExpired):
            proc.wait(0)  # reaps a child of ours that exited
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True
