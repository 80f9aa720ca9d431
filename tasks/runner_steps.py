"""Tasks of the ``run-runner`` flow beyond ``run-shard``: ``build-env-<runner>`` and ``merge-<runner>``.

Like infer's, except that a runner's env need not hold a dataset (the plan comes from the index list)
and the merge returns whatever the runner's ``merge`` returns.
"""

from __future__ import annotations

import time

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from espnet3_prefect.tasks.build_env import register_env, retry_if_it_can_help
from espnet3_prefect.tasks.merge import ready_to_merge


@task(name="build-env", task_run_name="build-env-{work.test_set}", retries=1, retry_delay_seconds=2,
      retry_condition_fn=retry_if_it_can_help, cache_policy=NO_CACHE)
def build_runner_env(work, builder) -> dict:
    """Register the env plugin (every worker builds the env once, in a thread) and build it here;
    returns ``{"workers": n, "keys": [env keys]}``."""
    logger = get_run_logger()
    env, workers = register_env(work, builder)
    logger.info("env %s built on %d worker(s): %s", work.env_key, workers, ", ".join(sorted(env)) or "(empty)")
    return {"workers": workers, "keys": sorted(env)}


@task(name="merge", task_run_name="merge-{stage.test_set}", cache_policy=NO_CACHE, retries=0)
def merge_runner(stage, shards: list, n_items: int, what: str | None = None):
    """``stage.runner.merge(shard_dirs)`` on the driver, once every shard is done; returns its result."""
    logger = get_run_logger()
    dirs, _ = ready_to_merge(stage, shards, n_items, logger, what=what)
    started = time.perf_counter()
    result = stage.runner.merge(dirs)
    logger.info("merged %d shards of %s in %.2f s", len(dirs), stage.layout.root, time.perf_counter() - started)
    return result
