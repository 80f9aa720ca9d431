"""espnet3-prefect: ESPnet3 stages as Prefect flows on Dask clusters built from the ``parallel`` block.

Public API: the ESPnet3 contracts, the errors, and the entry points a recipe needs::

    from espnet3_prefect import EnvironmentProvider, InferenceProvider, BaseRunner, InferenceRunner
    from espnet3_prefect import load_config, prefect_api

The flows live in ``espnet3_prefect.flows`` (``flows/`` in the repository), the tasks in
``espnet3_prefect.tasks``; the command line is ``espnet3-prefect`` (:mod:`espnet3_prefect.cli`).
"""

from .config import load_config
from .errors import BadInputError, ConfigError, Espnet3PrefectError, ItemError, MissingExtraError
from .provider import EnvironmentProvider, InferenceProvider
from .runner import BaseRunner, InferenceRunner
from .server import prefect_api

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

__all__ = [
    "BadInputError", "BaseRunner", "ConfigError", "EnvironmentProvider", "Espnet3PrefectError",
    "InferenceProvider", "InferenceRunner", "ItemError", "MissingExtraError", "load_config", "prefect_api",
]
