"""A real PostgreSQL for the tests: one private cluster per test process (Debian's binaries, 127.0.0.1,
a free port, fsync off), with a Prefect-migrated template database, and a fresh copy of it for each
server a test starts (:func:`fresh_database`): ~0.3 s instead of Prefect's migrations on every start.

Without the binaries the tests skip; with ``E3P_REQUIRE_POSTGRES=1`` (CI sets it) they fail instead.
The cluster is stopped by pid when the test process exits (:func:`shutdown`, also called by the
session fixture in tests/conftest.py).
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from espnet3_prefect.server import postgres

REQUIRE_VAR = "E3P_REQUIRE_POSTGRES"
#: the databases a server-backed test file runs its server on, as fixture params: SQLite (every test)
#: and PostgreSQL (only the tests marked ``postgres``; tests/conftest.py deselects the others)
DATABASES = ["sqlite", pytest.param("postgres", id="postgres")]
TEMPLATE = "e3p_template"

_lock = threading.Lock()
_cluster: postgres.Database | None = None
_folder: Path | None = None
_count = itertools.count()


def require() -> None:
    """Skip the calling test when no private PostgreSQL can start here; fail under E3P_REQUIRE_POSTGRES=1."""
    reason = postgres.missing()
    if reason is None:
        return
    if os.environ.get(REQUIRE_VAR) == "1":
        pytest.fail(f"{reason}; {REQUIRE_VAR}=1")
    pytest.skip(reason)


def client_env() -> dict[str, str]:
    """This environment without PREFECT_* (the CLI's own defaults)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}


def cluster() -> postgres.Database:
    """The test process's cluster, started (and its template migrated) on first use."""
    global _cluster, _folder
    require()
    with _lock:
        if _cluster is None:
            folder = reachable_tmp()
            atexit.register(shutdown)
            _folder = folder
            db = postgres.start_postgres(folder / "cluster", durable=False)
            _cluster = db
            template = postgres.create_database(db, TEMPLATE)
            postgres.migrate(template, {**client_env(), "PREFECT_HOME": str(folder / "prefect_home")})
        return _cluster


def reachable_tmp() -> Path:
    """A new temporary folder the cluster's user can pass through: pytest's own (``tmp_path``, under
    /tmp/pytest-of-root, mode 0700) is closed to the postgres user when the tests run as root. The
    caller removes it."""
    folder = Path(tempfile.mkdtemp(prefix="e3p-pg-"))
    folder.chmod(0o755)
    return folder


def fresh_database() -> postgres.Database:
    """A new, migrated, empty Prefect database in the test process's cluster."""
    return postgres.create_database(cluster(), f"t{os.getpid()}_{next(_count)}", template=TEMPLATE)


def shutdown() -> None:
    """Stop the test process's cluster (by pid) and remove its folder."""
    global _cluster, _folder
    with _lock:
        if _cluster is not None and _cluster.pid:
            postgres.stop_postgres(_cluster.pid)
        if _folder is not None:
            shutil.rmtree(_folder, ignore_errors=True)
        _cluster = _folder = None
