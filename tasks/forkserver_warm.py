"""The fork server's preload on ``env: local``: importing this module runs
:func:`~espnet3_prefect.tasks.preload.warm_up` once in the server that every local worker is forked
from (:mod:`espnet3_prefect.execution.backends.forkserver`), so each worker starts with Prefect, prefect-dask and
our task modules imported and their objects frozen out of the collector."""

from __future__ import annotations

from espnet3_prefect.tasks.preload import warm_up

warm_up()
