"""Baselines the infer flow is measured against, on the same recipe and the same shard files.

- ``sequential``: one loop in this process (build env, forward every item, write).
- ``plain_dask``: ESPnet3's own design: a LocalCluster, a WorkerPlugin that builds the env once per
  worker, ``client.map`` over the same shards, the driver concatenates the shard files.
"""

from __future__ import annotations

import time
from pathlib import Path

from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from espnet3_prefect.merge import concat_files
from espnet3_prefect.plan import plan_shards
from espnet3_prefect.stage import Stage

_ENV: dict = {}


class _Env(WorkerPlugin):
    name = "bench-env"

    def __init__(self, provider):
        self.provider = provider

    def setup(self, worker):
        _ENV["env"] = self.provider.build_env_local()


def _shard(runner, shard, out_dir: str) -> str:
    path = Path(out_dir) / f"split.{shard.index}"
    path.mkdir(parents=True, exist_ok=True)
    runner.write_shard(path, range(shard.start, shard.stop), _ENV["env"])
    return str(path / "y.scp")


def sequential(stage: Stage, n_items: int, out_dir: Path) -> float:
    started = time.perf_counter()
    env = stage.runner.provider.build_env_local()
    out_dir.mkdir(parents=True, exist_ok=True)
    stage.runner.write_shard(out_dir, range(n_items), env)
    return time.perf_counter() - started


def plain_dask(stage: Stage, n_items: int, n_workers: int, num_shards: int, out_dir: Path) -> float:
    started = time.perf_counter()
    shards = plan_shards(stage.test_set, n_items, num_shards)
    with LocalCluster(n_workers=n_workers, threads_per_worker=1, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as client:
        client.register_plugin(_Env(stage.runner.provider))
        futures = client.map(_shard, [stage.runner] * len(shards), shards, [str(out_dir)] * len(shards))
        parts = client.gather(futures)
    concat_files([Path(p) for p in parts], out_dir / "y.scp")
    return time.perf_counter() - started
