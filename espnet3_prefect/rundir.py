"""Where a flow run works: deployments run flows from the project root; ``workdir`` moves them.

``espnet3-prefect infer --detach`` passes the submitting shell's folder, so relative config paths
(``exp_dir: exp/...``) and recipe modules (``src.inference.MyProvider``) resolve as they would in a
run started from that folder.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import ConfigError
from .util import as_list, put_on_pythonpath

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
