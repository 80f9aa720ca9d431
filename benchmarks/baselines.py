"""Baselines the infer flow is measured against, on the same recipe and the same shard plan.

- ``sequential``: one loop in this process (build env, forward every unit, write).
- ``plain_dask``: ESPnet3 202611's own design (``BaseRunner._run_parallel_dask``): a LocalCluster, a
  WorkerPlugin that builds the env once per worker, ``client.map`` over the shards, each shard run
  as upstream's ``_run_one_shard`` does (``init_state``, then ``forward`` + ``reduce_state`` per unit,
  serially, ``finalize_state``, an empty ``done``), and the driver concatenating the shard files.

Both drive the runner class through its public hooks only, so they write the same files as the flow.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from distributed import Client, LocalCluster
from distributed.diagnostics.plugin import WorkerPlugin

from espnet3_prefect.disk.concat import concat_files
from espnet3_prefect.pipeline.plan import plan_shards
from espnet3_prefect.pipeline.stage import Stage

_ENV: dict = {}


class _Env(WorkerPlugin):
    name = "bench-env"

    def __init__(self, provider, out_dir: str):
        self.provider, self.out_dir = provider, out_dir

    def setup(self, worker):
        env = dict(self.provider.build_env_local())
        env.setdefault("output_dir", self.out_dir)
        _ENV["env"] = env


def run_one_shard(runner_cls: type, shard_id: int, units, env: dict) -> str:
    """Upstream's shard loop: no prefetch, no markers with checksums, nothing around the hooks."""
    state = runner_cls.init_state(shard_id=shard_id, **env)
    shard_dir = Path(state["shard_dir"])
    for unit in units:
        result = runner_cls.forward(unit, **env)
        state = runner_cls.reduce_state(state, result, shard_id=shard_id, **env)
    runner_cls.finalize_state(state, shard_id=shard_id, **env)
    (shard_dir / "done").write_text("", encoding="utf-8")
    return str(shard_dir)


def _shard(runner_cls, shard) -> str:
    return run_one_shard(runner_cls, shard.index, list(shard.units()), _ENV["env"])


def _merge(shard_dirs: list[Path], out_dir: Path, fields) -> None:
    for field in fields:
        concat_files([d / f"{field}.scp" for d in shard_dirs], out_dir / f"{field}.scp")


def sequential(stage: Stage, n_items: int, out_dir: Path, fields=("y",)) -> float:
    started = time.perf_counter()
    env = dict(stage.runner.provider.build_env_local())
    env["output_dir"] = str(out_dir)
    [shard] = plan_shards(stage.test_set, n_items, 1, stage.work.batch_size)
    shard_dir = Path(run_one_shard(stage.work.runner_cls, 0, list(shard.units()), env))
    _merge([shard_dir], out_dir, fields)
    return time.perf_counter() - started


def plain_dask(
    stage: Stage,
    n_items: int,
    n_workers: int,
    num_shards: int,
    out_dir: Path,
    fields=("y",),
    lengths=None,
    dask_settings: dict | None = None,
) -> float:
    """``dask_settings``: Dask configuration while the cluster lives (default: Dask's own)."""
    import dask

    started = time.perf_counter()
    shards = plan_shards(stage.test_set, n_items, num_shards, stage.work.batch_size, lengths=lengths)
    environ = dict(os.environ)  # Dask's nanny sets its pre-spawn variables here; later runs must not inherit them
    try:
        with (
            dask.config.set(dask_settings or {}),
            LocalCluster(
                n_workers=n_workers, threads_per_worker=1, host="127.0.0.1", dashboard_address="127.0.0.1:0"
            ) as cluster,
            Client(cluster) as client,
        ):
            client.register_plugin(_Env(stage.runner.provider, str(out_dir)))
            futures = client.map(_shard, [stage.work.runner_cls] * len(shards), shards, pure=False)
            parts = client.gather(futures)
    finally:
        os.environ.clear()
        os.environ.update(environ)
    _merge([Path(p) for p in parts], out_dir, fields)
    return time.perf_counter() - started
