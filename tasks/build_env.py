"""Task ``build-env``: build the provider env once on every Dask worker, present and future."""

from __future__ import annotations

from prefect import get_run_logger, task

from espnet3_prefect.errors import BadInputError, ConfigError
from espnet3_prefect.stage import dataset_id
from espnet3_prefect.worker_env import EnvPlugin, get_env


def _not_input_error(task, task_run, state) -> bool:
    """Retry only errors that a retry can fix (not bad config or bad input)."""
    try:
        state.result()
    except (ConfigError, BadInputError):
        return False
    except Exception:
        return True
    return True


@task(name="build-env", task_run_name="build-env-{stage.test_set}", retries=1, retry_delay_seconds=2,
      retry_condition_fn=_not_input_error)
def build_env(stage) -> dict:
    """Register an :class:`EnvPlugin` (every worker builds the env, in a thread) and size the dataset.

    Returns ``{"n_items": len(dataset), "workers": n, "dataset_id": ...}``: the plan needs the
    dataset length, and the driver never builds the dataset or the model itself.
    """
    from distributed import get_client

    logger = get_run_logger()
    client = get_client()
    client.register_plugin(EnvPlugin(stage.env_key, stage.runner.provider), name=f"espnet3-env-{stage.env_key}")
    env = get_env(stage.env_key, stage.runner.provider)
    if "dataset" not in env:
        raise ConfigError(f"provider {type(stage.runner.provider).__qualname__}: env has no 'dataset' entry "
                          f"(it has: {', '.join(sorted(env))}); the infer stage needs len(dataset)")
    n_items = len(env["dataset"])
    if n_items == 0:
        raise BadInputError(f"test set {stage.test_set!r}: dataset is empty")
    workers = len(client.scheduler_info(n_workers=-1)["workers"])
    logger.info("env %s built on %d worker(s); %d items", stage.env_key, workers, n_items)
    return {"n_items": n_items, "workers": workers, "dataset_id": dataset_id(env["dataset"])}
