"""Prefect tasks, one file per step, each a decorator and a call into the pipeline: ``build_env`` (the
provider env on every worker), ``run_shard`` (one shard, marked done), ``merge_shards`` (the runner's
merge, on the driver); ``score`` (metrics). Importing them has no side effect; ``preload`` is the Dask
worker preload that imports them as a worker starts, ``forkserver_warm`` the same once for the fork
server local workers are forked from."""
