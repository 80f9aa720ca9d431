"""Shared helpers for tests that run the command line in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from espnet3_prefect._internal.proc import pid_alive  # noqa: F401  (re-exported for the tests)
from tests.helpers.prefect_db import seed

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "espnet3_prefect.cli"]


def cli_env(home: Path) -> dict[str, str]:
    """The environment minus any PREFECT_* (so the CLI uses its embedded default), state in ``home``
    (seeded with a migrated Prefect database, :mod:`tests.helpers.prefect_db`)."""
    seed(home)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        ESPNET3_PREFECT_HOME=str(home), PYTHONPATH=str(ROOT), ESPNET3_PREFECT_REGISTRY=str(Path(home) / "registry")
    )  # `servers` sees this test's only
    return env


def start_infer(config: Path, cwd: Path, env: dict[str, str], **popen) -> subprocess.Popen:
    """``espnet3-prefect infer --config CONFIG`` started in a process group of its own (its workers with
    it), stdout and stderr piped as text; ``popen``: more ``subprocess.Popen`` arguments."""
    return subprocess.Popen(
        [*CLI, "infer", "--config", str(config)],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen,
    )


def copy_project(dest: Path) -> Path:
    """A copy of what ``deploy-local`` deploys (prefect.yaml, flows/, recipes/, deployments/) in ``dest/project``."""
    import shutil

    project = dest / "project"
    project.mkdir()
    shutil.copy(ROOT / "prefect.yaml", project)
    for folder in ("flows", "recipes", "deployments"):
        shutil.copytree(ROOT / folder, project / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return project


def wait_for(predicate, timeout_s: float, what: str):
    """Poll ``predicate`` every 0.5 s until it returns something true (returned), or fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


@contextlib.contextmanager
def deploy_local(base: Path, prepare=None, database: str = "sqlite"):
    """``deploy-local`` (a free port) on a copy of the project in ``base``, state in ``base/home``; yields
    ``(proc, state, env)``: the finished command, its state record (None when it wrote none) and the
    environment it ran with (PREFECT_* removed). ``prepare(project, env)`` runs first. ``database``:
    ``"sqlite"`` (the default), or ``"postgres"``: a fresh database of the test process's PostgreSQL
    cluster (``--database URL``, its password file in PGPASSFILE; :mod:`tests.helpers.postgres`). On
    exit: ``deploy-local --stop``, then its worker and server must be gone (by pid) and its state file too."""
    from espnet3_prefect.server.process import free_port

    project = copy_project(base)
    home = base / "home"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(ESPNET3_PREFECT_HOME=str(home), PYTHONPATH=str(ROOT))
    if prepare is not None:
        prepare(project, env)
    options = []
    if database == "postgres":
        from tests.helpers.postgres import fresh_database

        db = fresh_database()
        options = ["--database", db.url]
        env["PGPASSFILE"] = str(db.passfile)
    proc = subprocess.run(
        [*CLI, "deploy-local", "--port", str(free_port()), "--project-dir", str(project), *options],
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
    )
    state_file = home / "deploy-local.json"
    state = json.loads(state_file.read_text()) if state_file.exists() else None
    try:
        yield proc, state, env
    finally:
        from espnet3_prefect._internal.proc import descendants

        # everything it started: the worker, the flow runs the worker started (their own sessions), the server
        family = [p for k in ("worker_pid", "server_pid") if state for p in (state[k], *descendants(state[k]))]
        started = time.monotonic()
        stop = subprocess.run([*CLI, "deploy-local", "--stop"], env=env, capture_output=True, text=True, timeout=120)
        seconds = time.monotonic() - started
        if state is not None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and any(pid_alive(p) for p in family):
                time.sleep(0.5)
            left = {p: _cmdline(p) for p in family if pid_alive(p)}
            assert not left, f"left running after deploy-local --stop: {left}; {stop.stdout + stop.stderr}"
            assert not state_file.exists()
            # each told the way it listens (the worker SIGINT), none waited out to be killed (was 19-20 s)
            assert seconds < STOP_BOUND_S, f"deploy-local --stop took {seconds:.1f} s: {stop.stdout + stop.stderr}"


#: what a ``deploy-local --stop`` may take, the CLI's own start included (it took 19-20 s when the
#: worker was killed after a 15-s wait)
STOP_BOUND_S = 12


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"
