"""Child processes: the one helper for subprocess calls (logs the command, raises with its output),
and stopping processes, process groups and whole process trees by pid."""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

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


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists (also a zombie, and one we may not signal)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def stop_group(pid: int, timeout_s: float = 20, first: int = signal.SIGTERM) -> None:
    """Stop the process group led by ``pid`` (started with ``start_new_session``): ``first`` (the
    signal its processes stop on: SIGTERM for most, SIGINT for a Prefect worker), then SIGKILL after
    ``timeout_s`` (the last resort). Returns when ``pid`` is gone."""
    for sig in (first, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not pid_alive(pid):
                return
            time.sleep(0.1)


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux ``/proc``; empty elsewhere), parents first."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1:
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        for child in parents.get(queue.pop(0), []):
            found.append(child)
            queue.append(child)
    return found


def stop_tree(pid: int, timeout_s: float = 15, first: int = signal.SIGTERM) -> bool:
    """Stop ``pid``, its process group and every process it started, also those in their own session
    (a Prefect worker starts each flow run as a child in its own session, which starts Dask workers).
    ``pid``'s group is told ``first`` (a Prefect worker stops on SIGINT: no new runs, then exit), every
    other descendant SIGTERM (a flow run's engine and Dask's workers stop on it), all at once, so
    that a parent that waits for its children does not wait in vain; whatever still runs after
    ``timeout_s`` is killed (SIGKILL, the last resort). False when ``pid`` was not running (gone, or a
    zombie). Descendants are found through Linux ``/proc`` (elsewhere only the group goes)."""
    if not (pid > 0 and running(pid)):
        return False
    family = descendants(pid)
    for last_resort in (False, True):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL if last_resort else first)  # nothing when pid leads no group
        for member in (pid, *family):
            if running(member) and not _in_group(member, pid):
                sig = signal.SIGKILL if last_resort else first if member == pid else signal.SIGTERM
                with contextlib.suppress(ProcessLookupError):
                    os.kill(member, sig)
        left = [p for p in (pid, *family) if running(p)]
        deadline = time.monotonic() + timeout_s
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = [p for p in left if running(p)]
        if not left:
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
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    if not pid_alive(pid):
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
