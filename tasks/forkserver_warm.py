"""The fork server's preload on ``env: local``: importing this module runs
:func:`~espnet3_prefect.tasks.preload.warm_up` once in the server that every local worker is forked
from (:mod:`espnet3_prefect.execution.backends.forkserver`), so each worker starts with Prefect, prefect-dask and
our task modules imported, and the stage's own modules the driver named (its model's, its
provider's: :data:`~espnet3_prefect.execution.backends.forkserver.STAGE_MODULES_VAR`), their objects
frozen out of the collector."""

from __future__ import annotations

from espnet3_prefect.tasks.preload import stage_modules_to_import, warm_up

warm_up(stage_modules_to_import())
