"""Task ``build-env``: build the provider env once on every Dask worker, present and future."""

from __future__ import annotations

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from espnet3_prefect.errors import BadInputError, ConfigError, is_retryable
from espnet3_prefect.pipeline.env import EnvPlugin, get_env
from espnet3_prefect.pipeline.report import quiet_console
from espnet3_prefect.pipeline.sizing import check_input_keys, dataset_id


def retry_if_it_can_help(task, task_run, state) -> bool:
    """Retry only errors a retry can fix (never bad config or bad input): see ``is_retryable``."""
    try:
        state.result()
    except Exception as exc:  # noqa: BLE001 - classified below
        return is_retryable(exc)
    return True


@task(
    name="build-env",
    task_run_name="build-env-{work.test_set}",
    retries=1,
    retry_delay_seconds=2,
    retry_condition_fn=retry_if_it_can_help,
    cache_policy=NO_CACHE,
)
def build_env(work, builder, sized: bool = True) -> dict:
    """Register an :class:`EnvPlugin` (every worker builds the env, in a thread) and, when ``sized``,
    size the dataset.

    Returns ``{"n_items": len(dataset), "workers": n, "dataset_id": ...}``: the plan needs the
    dataset length, and the driver never builds the dataset or the model itself. Unsized (a runner
    over an index list, whose env need not hold a dataset): ``{"workers": n, "keys": [env keys]}``.
    """
    quiet_console()  # one terminal line per shard in the process that runs it
    logger = get_run_logger()
    env, workers = register_env(work, builder)
    if not sized:
        logger.info("env %s built on %d worker(s): %s", work.env_key, workers, ", ".join(sorted(env)) or "(empty)")
        return {"workers": workers, "keys": sorted(env)}
    if "dataset" not in env:
        raise ConfigError(
            f"provider: its env has no 'dataset' entry (it has: {', '.join(sorted(env))}); "
            f"the infer stage needs len(dataset)"
        )
    n_items = len(env["dataset"])
    if n_items == 0:
        raise BadInputError(f"test set {work.test_set!r}: dataset is empty; check the dataset manifest")
    check_input_keys(env["dataset"], env.get("input_key"), env.get("inference_contract"), work.test_set)
    logger.info("env %s built on %d worker(s); %d items", work.env_key, workers, n_items)
    return {"n_items": n_items, "workers": workers, "dataset_id": dataset_id(env["dataset"])}


def register_env(work, builder) -> tuple[dict, int]:
    """From a task on a Dask worker: register the env plugin for ``work.env_key`` (every worker,
    present and future, builds the env once) and build it here; returns ``(env, worker count)``."""
    from distributed import get_client

    client = get_client()
    client.register_plugin(EnvPlugin(work.env_key, builder), name=f"espnet3-env-{work.env_key}")
    env = get_env(work.env_key, builder)
    return env, len(client.scheduler_info(n_workers=-1)["workers"])
