"""Doctests: ``pytest`` collects the examples in espnet3_prefect/, flows/ and tasks/ (``--doctest-modules``).

flows/ and tasks/ are installed as ``espnet3_prefect.flows`` and ``espnet3_prefect.tasks``. Collected
by path, their modules would be imported a second time as ``flows.infer`` ...; here they are
imported once, under their installed names, and pytest finds them there.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
INSTALLED_AS = {"flows": "espnet3_prefect.flows", "tasks": "espnet3_prefect.tasks"}
# The Dask worker preload acts on import (reads $ESPNET3_PREFECT_CLIENT_FILE, exits without it), and so
# does the fork server's (imports and freezes everything it loaded): no doctests.
collect_ignore = ["espnet3_prefect/execution/worker_api.py", "tasks/forkserver_warm.py"]
# local_gpu's cluster class subclasses dask-cuda's (the [gpu] extra): it has no examples, and where
# dask_cuda is not installed it does not import.
collect_ignore += ["espnet3_prefect/execution/backends/cuda_cluster.py"]


def pytest_collect_file(file_path: Path, parent):
    folder = file_path.parent
    if file_path.suffix != ".py" or folder.parent != ROOT or folder.name not in INSTALLED_AS:
        return None
    package = INSTALLED_AS[folder.name]
    sys.modules.setdefault(folder.name, importlib.import_module(package))
    if file_path.stem != "__init__":
        name = f"{folder.name}.{file_path.stem}"
        sys.modules.setdefault(name, importlib.import_module(f"{package}.{file_path.stem}"))
    return None
