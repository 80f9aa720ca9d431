"""The guard of a run's own Prefect server: a small process that starts the server and stops it when
the run that started it has died, however it died (``kill -9``, an OOM kill, a login session ending).

A server that a run starts and does not keep (``prefect_api(keep=False)``) is started through this
guard: :func:`~espnet3_prefect.server.process.start_server` starts the guard as the leader of a new
process group, and the guard starts the server in a group of its own. The guard's pid is the one
recorded (``server.json``, the registry) and the one stopped: it tells the server once, the way a
``prefect server start`` (uvicorn) listens (SIGTERM: a graceful shutdown), waits for it, kills its
group only as the last resort, then exits.

Every ``WATCH_S`` it looks at its parent, the run: when the guard's parent has changed (the run is
gone: the guard was handed to init or a subreaper) and no other live process is recorded as a user
in ``<state>/users/<pid>`` (concurrent runs of one project share one server), it stops the server as
above and removes the records the run would have removed (:func:`~espnet3_prefect.server.process.forget_server`,
the registry record). A run that ends normally stops the server itself, as before; a run that ends
while another still uses the server leaves it to that one, and to this guard if that one dies too.

The server gets ``PR_SET_PDEATHSIG`` (SIGTERM) on the guard: should the guard itself be killed, the
server is told too. That is safe here, where it is not in the run: Linux sends it when the *thread*
that started the child ends, and the guard starts the server from its only thread, which lives as
long as the guard does.

It is run as a script (``python -I guard.py``), not as ``-m espnet3_prefect.server.guard``: importing
the package would import Prefect (seconds of CPU, and the memory held for the server's life). It
imports only the standard library, and loads one file of the package by its path:
:mod:`espnet3_prefect._internal.stopping` (psutil; the stop and its timeouts); the records are removed
by a short-lived ``python -c`` that imports the package, only after a run died.

    python -I guard.py --parent PID --home STATE_DIR --api-url URL --registry DIR -- prefect server start ...
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time

if __package__:  # imported as espnet3_prefect.server.guard: the package is loaded already
    from espnet3_prefect._internal import stopping
else:  # run as a script: this one file, not the package
    import importlib.util

    _STOPPING = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "_internal", "stopping.py")
    _spec = importlib.util.spec_from_file_location("espnet3_prefect_guard_stopping", _STOPPING)
    stopping = importlib.util.module_from_spec(_spec)
    sys.modules[_spec.name] = stopping  # a dataclass looks its module up there
    _spec.loader.exec_module(stopping)

WATCH_S = 0.5  # how often the run's pid and the server are looked at
#: how long the server may take to stop on SIGTERM (it drains its services' queues first) before its
#: group is killed: within a run's own stop timeout (``stopping.SERVER_STOP`` keeps them in order)
GRACE_S = stopping.SERVER_STOP.guard_grace_s
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
PR_SET_PDEATHSIG = 1

_asked_to_stop: list[int] = []


def _alive(pid: int) -> bool:
    """Running, not a zombie (Linux ``/proc``; elsewhere: the pid exists)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True


#: the lock every run of one state folder holds while it registers and finds or starts the server, and
#: while it unregisters, checks for other users and stops it: no run stops a server another just took
USERS_LOCK = "users.lock"


@contextlib.contextmanager
def users_lock(home: str):
    """Hold the state folder's :data:`USERS_LOCK` (``flock``: released by the kernel if the holder dies)."""
    with open(os.path.join(home, USERS_LOCK), "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def live_users(users_dir: str, exclude: set[int]) -> list[int]:
    """The pids recorded in ``users_dir`` (one empty file per pid) that are running, but ``exclude``."""
    try:
        names = os.listdir(users_dir)
    except OSError:
        return []
    return [int(n) for n in names if n.isdigit() and int(n) not in exclude and _alive(int(n))]


def _die_with_me():
    """What the server's child runs before exec: SIGTERM to it when the guard dies (see the module's
    docstring). Loaded here, before the fork: the child only calls it. None where there is no prctl."""
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the guard's own stop is what remains
        return None
    return lambda: prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def stop(server: subprocess.Popen, grace_s: float = GRACE_S) -> int:
    """SIGTERM to the server's group (uvicorn shuts down on it), SIGKILL after ``grace_s``
    (:func:`~espnet3_prefect._internal.stopping.stop_process`); the guard's exit code: 0 once the
    server is gone, 1 when it outlived SIGKILL."""
    if stopping.stop_process(server.pid, grace_s, group=True):
        return 0
    print(f"espnet3-prefect guard: the server (pid {server.pid}) still runs after SIGKILL", flush=True)
    return 1


def forget(args: argparse.Namespace) -> None:
    """Remove what a run removes when it stops its server: the registry record, and ``server.json``,
    the client file and the certificate folder through the package's own ``forget_server``."""
    try:
        os.unlink(os.path.join(args.registry, f"{os.getpid()}.json"))
    except OSError:
        pass
    code = (
        "import sys; from pathlib import Path; from espnet3_prefect.server.process import forget_server; "
        "forget_server(Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3])"
    )
    try:
        subprocess.run(
            [sys.executable, "-c", code, args.home, str(os.getpid()), args.api_url],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=60,
        )
    except (OSError, subprocess.SubprocessError):
        pass
    users = os.path.join(args.home, "users")
    try:
        names = os.listdir(users)
    except OSError:
        names = []
    for name in names:  # the entries of the dead runs (this guard's run, the last user)
        if not (name.isdigit() and _alive(int(name))) or int(name) == args.parent:
            try:
                os.unlink(os.path.join(users, name))
            except OSError:
                pass


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parent", type=int, required=True, help="pid of the run that started the server")
    parser.add_argument("--home", required=True, help="the server's state dir (its users/ and server.json)")
    parser.add_argument("--api-url", required=True)
    parser.add_argument("--registry", required=True, help="the registry folder (<guard pid>.json)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no server command after --")
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda signum, frame: _asked_to_stop.append(signum))
    server = subprocess.Popen(command, start_new_session=True, preexec_fn=_die_with_me())  # noqa: PLW1509
    users_dir = os.path.join(args.home, "users")
    while True:
        if _asked_to_stop:
            return stop(server)
        code = server.poll()
        if code is not None:  # it ended by itself: whoever waits for it sees why
            return code
        if os.getppid() != args.parent:  # the run is gone
            with users_lock(args.home):  # no run registers between the check and the stop
                others = live_users(users_dir, exclude={args.parent, os.getpid(), server.pid})
                if not others:
                    print(
                        f"espnet3-prefect guard: the run (pid {args.parent}) is gone: stopping its server", flush=True
                    )
                    code = stop(server)
                    forget(args)
                    return code
        time.sleep(WATCH_S)


if __name__ == "__main__":
    sys.exit(main())
