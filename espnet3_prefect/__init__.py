"""espnet3-prefect: ESPnet3 stages as Prefect flows on Dask clusters built from the ``parallel`` block.

Public API: the ESPnet3 202611 contracts, the errors, and the entry points a recipe needs::

    from espnet3_prefect import EnvironmentProvider, InferenceProvider, BaseRunner, InferenceRunner
    from espnet3_prefect import infer, measure          # drop-in for espnet3.systems.base.{inference,metric}
    from espnet3_prefect import launch                  # drop-in for espnet3.systems.launch.launch (run.py)
    from espnet3_prefect import set_parallel, get_parallel_config, run
    from espnet3_prefect import checkpoint_saved        # a training script: one event per checkpoint written
    set_parallel(cfg.parallel); runner(range(n))        # a Prefect flow run ``run-runner`` on that cluster
    run(any_runner, indices, parallel=cfg.parallel)     # the same for any runner (real espnet3 classes too)

The flows live in ``espnet3_prefect.flows`` (``flows/`` in the repository), the tasks in
``espnet3_prefect.tasks``; the command line is ``espnet3-prefect`` (:mod:`espnet3_prefect.cli`).
"""

from espnet3_prefect.config.load import load_config
from espnet3_prefect.entry import checkpoint_saved, infer, measure, run
from espnet3_prefect.errors import BadInputError, ConfigError, Espnet3PrefectError, ItemError, MissingExtraError
from espnet3_prefect.espnet3.inference_runner import InferenceRunner
from espnet3_prefect.espnet3.provider import EnvironmentProvider, InferenceProvider, resolve_device
from espnet3_prefect.espnet3.runner import BaseRunner
from espnet3_prefect.execution.process_parallel import get_parallel_config, set_parallel
from espnet3_prefect.launch import launch
from espnet3_prefect.server.embedded import prefect_api

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

__all__ = [
    "BadInputError",
    "BaseRunner",
    "checkpoint_saved",
    "ConfigError",
    "EnvironmentProvider",
    "Espnet3PrefectError",
    "InferenceProvider",
    "InferenceRunner",
    "ItemError",
    "MissingExtraError",
    "get_parallel_config",
    "infer",
    "launch",
    "load_config",
    "measure",
    "prefect_api",
    "resolve_device",
    "run",
    "set_parallel",
]
