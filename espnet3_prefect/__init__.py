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

from .checkpoint_events import checkpoint_saved
from .config import load_config
from .entry import infer, measure, run
from .errors import BadInputError, ConfigError, Espnet3PrefectError, ItemError, MissingExtraError
from .inference_runner import InferenceRunner
from .launch import launch
from .provider import EnvironmentProvider, InferenceProvider, resolve_device
from .runner import BaseRunner
from .parallel_config import get_parallel_config, set_parallel
from .server import prefect_api

__version__ = "0.1.0"  # the one place the version is written (pyproject.toml reads it)

__all__ = [
    "BadInputError", "BaseRunner", "checkpoint_saved", "ConfigError", "EnvironmentProvider", "Espnet3PrefectError",
    "InferenceProvider", "InferenceRunner", "ItemError", "MissingExtraError", "get_parallel_config", "infer",
    "launch", "load_config", "measure", "prefect_api", "resolve_device", "run", "set_parallel",
]
