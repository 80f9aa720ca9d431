"""Small helpers shared across the package: value checks, list parameters, JSON files, PYTHONPATH."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any


def is_int(value: Any) -> bool:
    """An ``int`` that is not a ``bool`` (YAML's ``true`` is not a count).

    >>> is_int(3), is_int(True), is_int(3.0)
    (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An ``int`` or ``float`` that is not a ``bool``.

    >>> is_number(0.5), is_number(2), is_number(False), is_number("1")
    (True, True, False, False)
    """
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def as_list(value: Any) -> list[str]:
    """A config/overrides parameter as a list of strings (a single string is one item).

    >>> as_list(None), as_list("a.yaml"), as_list(["a.yaml", Path("b.yaml")])
    ([], ['a.yaml'], ['a.yaml', 'b.yaml'])
    """
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def read_json(path: str | os.PathLike) -> Any | None:
    """The parsed content of a JSON file; None when it is missing, unreadable or not JSON.

    >>> read_json("/nonexistent/file.json") is None
    True
    """
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def put_on_pythonpath(folder: str | os.PathLike, *, first: bool = True, here_too: bool = True) -> str:
    """Make modules in ``folder`` importable by processes started from now on (Dask workers, batch
    jobs: they get ``PYTHONPATH``) and, with ``here_too``, in this process (``sys.path``).

    ``first`` puts it in front, also when it is already further back (a recipe folder: its
    ``src.inference`` must win over the TEMPLATE's ``src``); otherwise it is appended where it is
    missing, so nothing already on the path is shadowed. Returns the absolute folder.
    """
    here = str(Path(folder).resolve())
    if here_too and (first or here not in sys.path):
        sys.path[:] = [here, *(p for p in sys.path if p != here)] if first else [*sys.path, here]
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if first or here not in parts:
        parts = [p for p in parts if p != here]
        os.environ["PYTHONPATH"] = os.pathsep.join([here, *parts] if first else [*parts, here])
    return here


# The Prefect API credential on workers (server/auth.py writes the file; backends pass on its path only).
CLIENT_FILE_VAR = "ESPNET3_PREFECT_CLIENT_FILE"
CLIENT_FILE_PRELOAD = (
    "espnet3_prefect.execution.worker_api"  # the Dask worker preload that reads it (dask worker --preload)
)
SECRET_VARS = ("PREFECT_API_AUTH_STRING", "PREFECT_API_KEY", "PREFECT_SERVER_API_AUTH_STRING")
"""Variables holding a credential: never exported to batch jobs or written on a command line."""


def without_secrets(environ: Any) -> dict[str, str]:
    """``environ`` less the credentials (:data:`SECRET_VARS`): what a batch submission passes on.

    >>> without_secrets({"PATH": "/bin", "PREFECT_API_AUTH_STRING": "u:p"})
    {'PATH': '/bin'}
    """
    return {k: v for k, v in environ.items() if k not in SECRET_VARS}


# -- files only the user may read (TLS keys) ----------------------------------------------------


def private_folder(directory: Path) -> Path:
    """``directory`` empty and 0700 (made here, whatever the umask; what an earlier attempt left in it
    is removed), the user's own and no symbolic link: where key files may be written."""
    from espnet3_prefect.errors import ConfigError

    directory.parent.mkdir(parents=True, exist_ok=True)
    if directory.is_symlink():
        raise ConfigError(f"{directory}: is a symbolic link, refusing to write TLS keys there")
    if directory.exists() and any(directory.iterdir()):
        shutil.rmtree(directory)  # left by an earlier attempt
    if not directory.exists():
        os.mkdir(directory, 0o700)
    if directory.stat().st_uid != os.getuid():
        raise ConfigError(f"{directory}: belongs to another user, refusing to write TLS keys there")
    os.chmod(directory, 0o700)  # whatever the umask
    return directory


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to a new file only the user can read (0600 from the start, never a symlink)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)


def import_keeping_ctrl_c(module_name: str):
    """Import ``module_name`` and put the process's SIGINT handler back as it was.

    ``dask_jobqueue`` (any of its modules: its package imports ``runner``) installs a SIGINT handler
    at import time that exits silently with status 0, so a Ctrl-C, or the server watch's interrupt,
    would end a run as if it had succeeded. Off the main thread that import fails instead ("signal
    only works in main thread"): import it from the main thread first.

    >>> import signal
    >>> before = signal.getsignal(signal.SIGINT)
    >>> import_keeping_ctrl_c("json").__name__, signal.getsignal(signal.SIGINT) is before
    ('json', True)
    """
    import importlib
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return importlib.import_module(module_name)
    handler = signal.getsignal(signal.SIGINT)
    try:
        return importlib.import_module(module_name)
    finally:
        if handler is not None and signal.getsignal(signal.SIGINT) is not handler:
            signal.signal(signal.SIGINT, handler)
