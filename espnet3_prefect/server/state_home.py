"""Where espnet3-prefect keeps the embedded Prefect server's state: the per-project state dir
(:func:`state_dir`: database, logs, pids, the client file, the certificate folder) and the per-user
registry of the servers it started (:func:`registry_dir`). Moved out of :mod:`espnet3_prefect.server.embedded`,
which re-exports these names.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from espnet3_prefect._internal.atomic import atomic_write_text

DEFAULT_STATE_DIR = ".e3p/prefect"
"""The default state dir, relative to the project folder (:func:`project_folder`)."""
PREFECT_HOME_DIR = "prefect_home"
"""Prefect's own home (``PREFECT_HOME``: its database, settings) inside a state dir."""
CLIENT_HOME_DIR = "client_home"
"""The ``PREFECT_HOME`` of the processes that use the embedded server (the run, its workers) inside a state dir."""
STATE_DIR_HELP = (
    "embedded server state (default $ESPNET3_PREFECT_HOME, else .e3p/prefect in the git "
    "checkout of the current folder, else in the current folder)"
)


def project_folder(start: str | Path | None = None) -> Path:
    """The git checkout holding ``start`` (default: the current folder), else ``start`` itself.

    >>> import tempfile; d = Path(tempfile.mkdtemp()); (d / ".git").mkdir(); (d / "a/b").mkdir(parents=True)
    >>> project_folder(d / "a/b") == d.resolve()
    True
    """
    here = Path(start or os.getcwd()).expanduser().resolve()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():  # a folder, or a file in worktrees and submodules
            return folder
    return here


def default_state_dir(start: str | Path | None = None) -> Path:
    """``<project>/.e3p/prefect`` for the project of ``start`` (default: the current folder); not created."""
    return project_folder(start) / DEFAULT_STATE_DIR


def state_dir(path: str | Path | None = None) -> Path:
    """Where the embedded server keeps its database, logs and pid (created if missing).

    ``path``, else ``$ESPNET3_PREFECT_HOME``, else ``<project>/.e3p/prefect`` where ``<project>`` is
    the git checkout of the current folder (else the current folder): one Prefect server and UI per
    project, so the runs of unrelated projects never mix. ``.e3p/`` gets a ``.gitignore`` of ``*``,
    so it never shows as untracked in the user's repository.
    """
    chosen = path or os.environ.get("ESPNET3_PREFECT_HOME")
    if chosen:
        out = Path(chosen).expanduser().resolve()
    else:
        out = default_state_dir()
        _git_ignored(out.parent)
    out.mkdir(parents=True, exist_ok=True)
    return out


def _git_ignored(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / ".gitignore"
    if not marker.exists():
        with contextlib.suppress(OSError):
            atomic_write_text(marker, "# espnet3-prefect's local state (Prefect server database, logs, pids)\n*\n")


def registry_dir() -> Path:
    """Per-user records of the servers :func:`start_server` started, one ``<pid>.json`` each.

    ``$ESPNET3_PREFECT_REGISTRY``, else ``$XDG_STATE_HOME/espnet3-prefect/servers`` (default
    ``~/.local/state/espnet3-prefect/servers``). State dirs are per project; this folder is what
    finds a server left running from any folder.
    """
    chosen = os.environ.get("ESPNET3_PREFECT_REGISTRY")
    if not chosen:
        chosen = Path(os.environ.get("XDG_STATE_HOME") or "~/.local/state") / "espnet3-prefect" / "servers"
    return Path(chosen).expanduser()
