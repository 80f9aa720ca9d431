"""A migrated, empty Prefect database, made once per test process and copied into the state dir of
each test that starts a server of its own.

A Prefect server on a new state dir first builds its SQLite database, every Alembic migration in
turn: ~9 s of CPU on the 2-core CI machine, paid again by each of the suite's tests that starts a
server on a ``tmp_path``. The migrations themselves are Prefect's; what the tests check starts after
them. :func:`seed` copies a database that is already at the head revision (made by this Prefect,
``prefect server database upgrade``) into ``<home>/prefect_home/prefect.db``, where
:func:`espnet3_prefect.server.process.start_server` points Prefect, so the server finds it
migrated. A run on a truly new state dir (the README's demo, fresh-clone, the realespnet layer)
still migrates from nothing.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
from contextlib import closing
from pathlib import Path

from espnet3_prefect.server.state_home import PREFECT_HOME_DIR

#: Prefect's SQLite database in its home (PREFECT_HOME), its default name
DATABASE = "prefect.db"

_lock = threading.Lock()
_template: Path | None = None


def template() -> Path:
    """The migrated database of this test process (made on first use, removed at exit)."""
    global _template
    with _lock:
        if _template is None:
            folder = Path(tempfile.mkdtemp(prefix="e3p-prefect-db-"))
            atexit.register(shutil.rmtree, folder, True)
            env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
            env["PREFECT_HOME"] = str(folder)
            proc = subprocess.run(
                [sys.executable, "-m", "prefect", "server", "database", "upgrade", "-y"],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if proc.returncode != 0 or not (folder / DATABASE).exists():
                output = proc.stdout[-1500:] + proc.stderr[-1500:]
                raise RuntimeError(f"prefect server database upgrade failed: {output}")
            _template = folder / DATABASE
        return _template


def seed(home: Path) -> Path:
    """Put a copy of :func:`template` where a server started on state dir ``home`` looks for its
    database, unless one is there already; returns ``home``. The copy is written beside and renamed
    into place, so a server never finds half a database."""
    target = Path(home) / PREFECT_HOME_DIR / DATABASE
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{DATABASE}.{os.getpid()}.partial")
        # sqlite's backup API: a consistent copy even if the source has a write-ahead log
        with closing(sqlite3.connect(template())) as source, closing(sqlite3.connect(partial)) as copy:
            source.backup(copy)
        os.replace(partial, target)
    return Path(home)
