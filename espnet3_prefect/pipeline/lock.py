"""One run per output folder: ``<inference_dir>/.espnet3-prefect.lock``.

The holder writes its pid, host and flow run id, and touches the file every ``HEARTBEAT_S``. A second
run is refused with the holder's details. A lock whose holder is gone (same host, pid dead or a zombie) or
silent for ``STALE_AFTER_S`` is taken over, and the flow run it names is reported for crash marking
(a flow takes its lock, and marks that run Crashed, with :func:`espnet3_prefect.pipeline.run_lock.take_run_lock`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from espnet3_prefect._internal.proc import running
from espnet3_prefect.disk.layout import RUN_LOCK_NAME as LOCK_NAME
from espnet3_prefect.errors import Espnet3PrefectError, named

HEARTBEAT_S = 15.0
STALE_AFTER_S = 120.0
UNREADABLE_GRACE_S = 5.0


class LockedError(Espnet3PrefectError, RuntimeError):
    """Another live run holds the output folder or shard. Never retried: a retry seconds later finds
    the same holder, and a lock we cannot tell is gone needs a person's decision."""

    retryable = False


#: errnos of a filesystem that cannot make hard links (some FUSE, SMB and object-store mounts)
_NO_HARD_LINKS = (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EXDEV, errno.EMLINK)


def create_whole(path: Path, text: str) -> bool:
    """Create ``path`` holding ``text``, exclusively: False if it exists; an ``OSError`` (a full disk)
    leaves nothing behind.

    The text goes to a hidden temporary file beside ``path``, which is then hard-linked to ``path``
    (atomic, and exclusive like ``O_EXCL``, NFS included), so ``path`` is never seen empty or half
    written: a lock that has a name always says who holds it. Where hard links are not supported,
    ``O_EXCL`` then write, removing the file again if the write fails.
    """
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as handle:
            handle.write(text)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise
            return _create_excl(path, text)
        return True
    except OSError as exc:
        named(exc, path)  # a failed write names no file
        raise
    finally:
        with contextlib.suppress(OSError):
            tmp.unlink()


def _create_excl(path: Path, text: str) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return True


@dataclass
class RunLock:
    path: Path
    stale_holder: dict | None = None  # what a taken-over lock said (its flow run may be left Running)
    _token: str = ""
    _stop: threading.Event | None = None

    def release(self) -> None:
        if self._stop is not None:
            self._stop.set()
        try:
            if json.loads(self.path.read_text()).get("token") == self._token:
                self.path.unlink()
        except (OSError, ValueError):
            pass


def _holder_gone(holder: dict, age_s: float) -> bool:
    if age_s > STALE_AFTER_S:
        return True
    if holder.get("host") != socket.gethostname():
        return False
    return _pid_gone(holder.get("pid", -1))


def acquire(folder: Path, flow_run_id: str | None = None) -> RunLock:
    """Take the lock on ``folder`` or raise :class:`LockedError` naming the live holder."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    token = uuid.uuid4().hex
    record = {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "flow_run_id": flow_run_id,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "token": token,
    }
    stale = None
    for _ in range(3):
        if not create_whole(path, json.dumps(record)):
            stale = _take_over_if_stale(path, folder) or stale
            continue
        return RunLock(path, stale_holder=stale, _token=token, _stop=_heartbeat(path))
    raise LockedError(f"{folder}: could not take the run lock {path}")


def _take_over_if_stale(path: Path, folder: Path) -> dict | None:
    try:
        age_s = time.time() - path.stat().st_mtime
    except OSError:
        return None  # released meanwhile: try again
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):  # unreadable: being written right now, or left half-written
        holder = {} if age_s < UNREADABLE_GRACE_S else {"pid": "?", "host": "?"}
        age_s = STALE_AFTER_S + 1 if age_s >= UNREADABLE_GRACE_S else age_s
    if not _holder_gone(holder, age_s):
        raise LockedError(
            f"{folder} is in use by pid {holder.get('pid')} on host {holder.get('host')} "
            f"(flow run {holder.get('flow_run_id')}, since {holder.get('started')}); wait for it or stop it"
        )
    aside = path.with_name(f"{LOCK_NAME}.stale-{uuid.uuid4().hex[:8]}")
    try:
        os.replace(path, aside)  # only one of several recovering runs wins this rename
        aside.unlink()
    except OSError:
        return None
    return holder


def _heartbeat(path: Path) -> threading.Event:
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            try:
                os.utime(path)
            except OSError:
                return

    threading.Thread(target=beat, name="espnet3-prefect-lock", daemon=True).start()
    return stop


# -- split.N/lock: held while one shard runs, as ESPnet3 202611 does ------------------------------


def take_shard_lock(path: Path, flow_run_id: str | None, allow_overwrite: bool = False) -> str | None:
    """Create ``split.N/lock`` exclusively, whole or not at all (:func:`create_whole`): our pid on the
    first line, as upstream writes it, then our host and flow run id.

    An existing lock is taken over when it belongs to this flow run (Dask re-runs a shard whose
    worker died), when its holder is a dead process on this host, when it is empty and not brand new
    (its writer could not even record its pid: a full disk; no live holder can be named), or when
    ``parallel.allow_overwrite_lock`` is set; the returned string says which. Otherwise another
    runner (ours or upstream's) is writing the shard, and :class:`LockedError` names it.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    text = f"{os.getpid()}\n{socket.gethostname()} {flow_run_id or '-'}\n"
    why = None
    for _ in range(5):
        if create_whole(path, text):
            return why
        why = _shard_lock_takeover(path, flow_run_id, allow_overwrite)
        if why is not None:
            path.unlink(missing_ok=True)
    raise LockedError(f"{path}: could not take the shard lock")


def release_shard_lock(path: Path) -> None:
    """Remove ``path`` if it is still this process's (not a lock another run took over meanwhile).
    Never raises: it runs on the way out of a failing shard, whose error is the one to report."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        return
    except OSError:
        lines = []  # unreadable: ours is the best guess, we created it
    if lines and (lines[0].strip() != str(os.getpid()) or not _same_host(lines)):
        return
    with contextlib.suppress(OSError):
        path.unlink()


def _same_host(lines: list[str]) -> bool:
    return len(lines) > 1 and lines[1].partition(" ")[0] == socket.gethostname()


def _shard_lock_takeover(path: Path, flow_run_id: str | None, allow_overwrite: bool) -> str | None:
    """Why the lock at ``path`` may be replaced, None to look again, or :class:`LockedError`."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
        age_s = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return None  # released meanwhile
    except (OSError, ValueError):
        lines, age_s = [], UNREADABLE_GRACE_S
    if not any(line.strip() for line in lines):
        if age_s < UNREADABLE_GRACE_S:  # upstream's lock between its creation and its pid
            time.sleep(UNREADABLE_GRACE_S - age_s)
            return None
        return "it was empty (its writer could not record its pid: a full disk?), so no live holder"
    pid = lines[0].strip()
    host, _, run = lines[1].partition(" ") if len(lines) > 1 else ("?", "", "-")
    run = run.strip() or "-"
    if flow_run_id and run == flow_run_id:
        return "held by this run's earlier attempt (its worker died)"
    if host == socket.gethostname() and _pid_gone(pid):
        return f"its holder (pid {pid}) is gone"
    if allow_overwrite:
        return f"parallel.allow_overwrite_lock is set (holder: pid {pid} on {host})"
    if host == "?":
        who = f"pid {pid} (no host recorded: upstream ESPnet3?)"
    else:
        who = f"pid {pid} on {host}" + (f", flow run {run}" if run != "-" else "")
        who += " (alive)" if host == socket.gethostname() else " (another host: cannot tell whether it is alive)"
    raise LockedError(
        f"{path.parent}: locked by {who}; another run is writing this shard. If that run has ended, "
        f"delete {path} (parallel.allow_overwrite_lock: true takes over every shard's lock, live ones too)"
    )


def _pid_gone(pid: str | int) -> bool:
    """Whether process ``pid`` of this host has ended (:func:`~espnet3_prefect._internal.proc.running`:
    no such process, or a zombie, which has exited and only waits to be reaped; a killed worker whose
    parent died with it stays one until init gets to it, a second or more here, forever under an
    init that never reaps). No pid recorded (not a positive number): not known to be gone.

    >>> _pid_gone(os.getpid()), _pid_gone("not a pid"), _pid_gone(-1)
    (False, False, False)
    """
    try:
        number = int(pid)
    except ValueError:
        return False
    return number > 0 and not running(number)
