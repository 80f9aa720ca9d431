"""Where a flow run works: deployments run flows from the project root; ``workdir`` moves them.

``espnet3-prefect infer --detach`` passes the submitting shell's folder, so relative config paths
(``exp_dir: exp/...``) and recipe modules (``src.inference.MyProvider``) resolve as they would in a
run started from that folder.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .errors import ConfigError


def enter_workdir(workdir: str | os.PathLike | None) -> Path:
    """``chdir`` into ``workdir`` (when given) and put it on ``sys.path`` and ``PYTHONPATH``.

    Dask workers started afterwards inherit both. Returns the current folder.
    """
    if workdir:
        path = Path(workdir).expanduser()
        if not path.is_dir():
            raise ConfigError(f"workdir: {workdir} is not a folder on this machine")
        os.chdir(path)
        here = str(path.resolve())
        if here not in sys.path:
            sys.path.insert(0, here)
        parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        if here not in parts:
            os.environ["PYTHONPATH"] = os.pathsep.join([here, *parts])
    return Path.cwd()


def as_list(value) -> list[str]:
    """A config/overrides parameter as a list of strings (a single string is one item)."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]
