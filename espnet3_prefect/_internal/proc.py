"""Child processes: the one helper for subprocess calls (logs the command, raises with its output),
and stopping processes, process groups and whole process trees by pid (one process's stop, its first
signal, wait and SIGKILL: :func:`~espnet3_prefect._internal.stopping.stop_process`, offered here too)."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
from collections.abc import Sequence

import psutil

from espnet3_prefect._internal.stopping import KILL_WAIT_S, stop_process, wait_gone
from espnet3_prefect._internal.stopping import proc_running as _running
from espnet3_prefect.errors import Espnet3PrefectError

log = logging.getLogger("espnet3_prefect")


class CommandError(Espnet3PrefectError, RuntimeError):
    """A command exited non-zero or timed out; the message holds the tail of its output."""


def run_command(
    cmd: Sequence[str], *, timeout_s: float = 60, check: bool = True, env: dict | None = None, cwd: str | None = None
) -> subprocess.CompletedProcess:
    """Run ``cmd``, log it, and raise :class:`CommandError` with its output when it fails.

    >>> run_command(["echo", "hi"]).stdout
    'hi\\n'
    """
    text = shlex.join(cmd)
    log.debug("running: %s", text)
    try:
        proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout_s, env=env, cwd=cwd)
    except subprocess.TimeoutExpired:
        raise CommandError(f"command timed out after {timeout_s} s: {text}") from None
    except FileNotFoundError:
        raise CommandError(f"command not found: {cmd[0]} (running: {text})") from None
    if check and proc.returncode != 0:
        tail = (proc.stdout + proc.stderr).strip()[-2000:]
        raise CommandError(f"command failed with exit code {proc.returncode}: {text}: {' '.join(tail.split())}")
    return proc


# ----------------------------------------------------------------------------- processes

#: how much later than recorded a process's start time may read (psutil derives it from the boot
#: time, which follows the clock, and a record's time may be cut to the second)
CLOCK_SLACK_S = 2.0


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists (also a zombie, and one we may not signal)."""
    return pid > 0 and psutil.pid_exists(pid)


def started_by(pid: int, when: float) -> bool:
    """Whether process ``pid`` exists and started no later than ``when`` (seconds since the epoch, give
    or take :data:`CLOCK_SLACK_S`): the process a record of that time names, not one that took its pid
    since. True when its start time may not be read (another user's process, on some systems)."""
    try:
        return pid > 0 and psutil.Process(pid).create_time() <= when + CLOCK_SLACK_S
    except psutil.AccessDenied:
        return True
    except psutil.NoSuchProcess:
        return False


def stop_group(pid: int, timeout_s: float = 20, first: int = signal.SIGTERM) -> bool:
    """Stop the process group led by ``pid`` (started with ``start_new_session``): ``first`` (the
    signal its processes stop on: SIGTERM for most, SIGINT for a Prefect worker), then SIGKILL after
    ``timeout_s`` (the last resort, :func:`stop_process`). True once ``pid`` is gone (a child of ours
    reaped); False, with a warning, when it outlived SIGKILL or is not ours to signal."""
    gone = stop_process(pid, timeout_s, first=first, group=True)
    if not gone:
        log.warning("process %d still runs: not ours to signal, or alive %g s after SIGKILL", pid, KILL_WAIT_S)
    return gone


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid``, parents first (empty when ``pid`` is gone)."""
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def stop_tree(pid: int, timeout_s: float = 15, first: int = signal.SIGTERM) -> bool:
    """Stop ``pid``, its process group and every process it started, also those in their own session
    (a Prefect worker starts each flow run as a child in its own session, which starts Dask workers).
    ``pid``'s group is told ``first`` (a Prefect worker stops on SIGINT: no new runs, then exit), every
    other descendant SIGTERM (a flow run's engine and Dask's workers stop on it), all at once, so
    that a parent that waits for its children does not wait in vain; whatever still runs after
    ``timeout_s`` is killed (SIGKILL, the last resort). False when ``pid`` was not running (gone, or a
    zombie). A pid taken by another process meanwhile is never signalled (psutil checks its start time)."""
    if not (pid > 0 and running(pid)):
        return False
    try:
        root = psutil.Process(pid)
        family = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for last_resort in (False, True):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL if last_resort else first)  # nothing when pid leads no group
        for member in family:
            if _running(member) and not _in_group(member.pid, pid):
                sig = signal.SIGKILL if last_resort else first if member is root else signal.SIGTERM
                with contextlib.suppress(psutil.NoSuchProcess):
                    member.send_signal(sig)
        if not wait_gone(family, timeout_s):
            break
    return True


def _in_group(pid: int, group: int) -> bool:
    """Whether ``pid`` belongs to the process group ``group`` (then :func:`os.killpg` told it already)."""
    try:
        return os.getpgid(pid) == group
    except OSError:
        return False


def running(pid: int) -> bool:
    """Alive and not a zombie (a child of ours that exited is reaped on the way)."""
    try:
        return pid > 0 and _running(psutil.Process(pid))
    except psutil.NoSuchProcess:
        return False
