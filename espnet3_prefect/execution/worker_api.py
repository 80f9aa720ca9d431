"""Dask worker preload (``dask worker --preload espnet3_prefect.execution.worker_api``): the Prefect API URL and
credential from the 0600 client file ``$ESPNET3_PREFECT_CLIENT_FILE`` names, set in this worker's
environment when dask imports it as the worker starts, before any task imports Prefect. Batch jobs and
SSH workers get only the file's path, so the credential is never in a job script, on a command line or
in a flow parameter.

A missing, empty, unparsable or group/other-readable file stops the worker with one line naming the
file (the run's job watcher reports it from the job log).
"""

from __future__ import annotations

import sys

from espnet3_prefect._internal.util import CLIENT_FILE_VAR
from espnet3_prefect.disk.client_file import CredentialFileError, load_client_environ


def _load() -> None:
    try:
        creds = load_client_environ()
    except CredentialFileError as exc:
        raise SystemExit(f"espnet3-prefect worker: {exc}") from None
    if creds is None:
        raise SystemExit(
            f"espnet3-prefect worker: {CLIENT_FILE_VAR} is not set; the worker cannot reach the Prefect API"
        )
    if "prefect" in sys.modules:  # imported before us after all: let its settings see the variables
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()


# On import, not in dask_setup: dask imports a preload as the worker command starts, so a bad file ends
# `dask worker` with our one line (and exit code 1); from dask_setup the same SystemExit comes wrapped in
# two screens of nanny tracebacks, and an Exception there is only logged while the worker goes on.
# (Not collected by pytest's doctest run: see conftest.py.)
_load()


def dask_setup(worker) -> None:  # noqa: ARG001 - the hook dask looks for
    """Nothing left to do: the client file was read when dask imported this module."""
