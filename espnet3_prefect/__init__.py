"""espnet3-prefect: ESPnet3 stages as Prefect flows on Dask clusters built from the ``parallel`` block.

Public API (the ESPnet3 contracts plus the pieces a recipe needs)::

    from espnet3_prefect import EnvironmentProvider, InferenceProvider, BaseRunner, InferenceRunner

The flows live in ``espnet3_prefect.flows`` (``flows/`` in the repository), the tasks in
``espnet3_prefect.tasks``; the command line is ``espnet3-prefect``.
"""

from .config import load_config
from .errors import BadInputError, ConfigError, Espnet3PrefectError, MissingExtraError
from .parallel import ParallelSpec, build_task_runner
from .plan import Shard, plan_shards
from .provider import EnvironmentProvider, InferenceProvider, resolve_device
from .runner import BaseRunner, InferenceRunner
from .server import prefect_api

__all__ = [
    "BadInputError", "BaseRunner", "ConfigError", "EnvironmentProvider", "Espnet3PrefectError",
    "InferenceProvider", "InferenceRunner", "MissingExtraError", "ParallelSpec", "Shard",
    "build_task_runner", "load_config", "plan_shards", "prefect_api", "resolve_device",
]
__version__ = "0.1.0"
