"""Shared helpers for tests that run the command line in a subprocess."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from espnet3_prefect._proc import pid_alive  # noqa: F401  (re-exported for the tests)

ROOT = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "espnet3_prefect.cli"]


def cli_env(home: Path) -> dict[str, str]:
    """The environment minus any PREFECT_* (so the CLI uses its embedded default), state in ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(ESPNET3_PREFECT_HOME=str(home), PYTHONPATH=str(ROOT),
               ESPNET3_PREFECT_REGISTRY=str(Path(home) / "registry"))  # `servers` sees this test's only
    return env


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
