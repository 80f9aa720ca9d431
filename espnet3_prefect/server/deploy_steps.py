"""Deployment steps for ``prefect.yaml``.

``enter_project`` is the pull step of every deployment: a flow run starts in the project checkout,
so the default parameters (``recipes/dtmf/conf/...``, ``deployments/parallel_*.yaml``) resolve.
"""

from __future__ import annotations

import os
from pathlib import Path

from espnet3_prefect.errors import ConfigError


def project_root(directory: str | None = None) -> Path:
    """The checkout to run from: ``directory``, else ``$ESPNET3_PREFECT_ROOT``, else the checkout this
    package is installed from (an editable install, as ``scripts/setup.sh`` makes)."""
    chosen = directory or os.environ.get("ESPNET3_PREFECT_ROOT")
    if chosen:
        root = Path(chosen).expanduser().resolve()
        if not root.is_dir():
            raise ConfigError(f"project folder {root} does not exist (from ESPNET3_PREFECT_ROOT or the pull step)")
        return root
    here = Path(__file__).resolve().parents[2]  # espnet3_prefect/server/ -> the checkout
    if (here / "prefect.yaml").is_file():
        return here
    raise ConfigError(
        "cannot find the project checkout: set ESPNET3_PREFECT_ROOT for the worker "
        "(espnet3-prefect is not installed from a checkout with a prefect.yaml)"
    )


def enter_project(directory: str | None = None) -> dict[str, str]:
    """Pull step: ``chdir`` into :func:`project_root`; returns ``{"directory": ...}`` like Prefect's own step."""
    root = project_root(directory)
    os.chdir(root)
    return {"directory": str(root)}
