"""Where a flow run works: deployments run flows from the project root; ``workdir`` moves them; the
output folders it writes must be writable, with room (:func:`check_writable`).

``espnet3-prefect infer --detach`` passes the submitting shell's folder, so relative config paths
(``exp_dir: exp/...``) and recipe modules (``src.inference.MyProvider``) resolve as they would in a
run started from that folder.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
import sys
import threading
import uuid
from pathlib import Path

from espnet3_prefect._internal.util import as_list, import_keeping_ctrl_c, put_on_pythonpath
from espnet3_prefect.errors import ConfigError, one_line

__all__ = ["as_list", "enter_workdir"]


def enter_workdir(workdir: str | os.PathLike | None) -> Path:
    """``chdir`` into ``workdir`` (when given) and put it on ``sys.path`` and ``PYTHONPATH``.

    Dask workers started afterwards inherit both. Returns the current folder.
    """
    if workdir:
        path = Path(workdir).expanduser()
        if not path.is_dir():
            raise ConfigError(f"workdir: {workdir} is not a folder on this machine")
        os.chdir(path)
        put_on_pythonpath(path)
    return Path.cwd()


def preload_on_main_thread() -> None:
    """Import ``dask_jobqueue`` now, on the main thread, when espnet3 is installed.

    ``espnet3.parallel`` imports ``dask_jobqueue``, whose ``runner`` module installs a SIGINT handler
    at import time, which Python allows only on the main thread: a recipe module importing espnet3's
    classes for the first time from a worker thread (the env build, a task) would fail with "signal
    only works in main thread". Python's own Ctrl-C handling is put back afterwards (the handler it
    installs exits silently with status 0).
    """
    if threading.current_thread() is not threading.main_thread() or "dask_jobqueue" in sys.modules:
        return
    if importlib.util.find_spec("espnet3") is None or importlib.util.find_spec("dask_jobqueue") is None:
        return
    import_keeping_ctrl_c("dask_jobqueue")


def check_writable(out_dir: Path, min_free_mb: float = 0.0, key: str = "inference_dir") -> None:
    """Fail before any compute when the output folder cannot be written or its disk is (nearly) full
    (``key`` names the setting in the message)."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        probe = out_dir / f".write-probe-{uuid.uuid4().hex[:8]}"
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{key}: cannot write to {out_dir}: {exc.strerror or one_line(exc)}") from None
    free_mb = shutil.disk_usage(out_dir).free / 1e6
    if free_mb < min_free_mb:
        raise ConfigError(
            f"{key}: only {free_mb:.0f} MB free on {out_dir}, runner.min_free_mb asks for {min_free_mb:.0f} MB"
        )
