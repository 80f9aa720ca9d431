"""``runner(indices)`` in this process: the same plan, shard loop, markers and merge as the flows,
without Dask or Prefect (ESPnet3's local mode, used when no parallel config is registered)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from espnet3_prefect.errors import ConfigError
from espnet3_prefect.pipeline.layout import StageLayout
from espnet3_prefect.pipeline.marker import check_marker
from espnet3_prefect.pipeline.plan import default_num_shards, plan_shards, write_manifest
from espnet3_prefect.pipeline.resume import remove_stale
from espnet3_prefect.pipeline.shard import run_shard
from espnet3_prefect.config.runner_keys import check_batch_size


def run_runner(runner: Any, indices: Iterable[int]) -> Any:
    """Plan ``indices`` (batched first), run the shards not already done, return ``runner.merge(...)``."""
    from espnet3_prefect.pipeline.runner_job import check_indices, runner_fingerprint

    if getattr(runner, "output_dir", None) is None:
        raise ConfigError(f"{type(runner).__qualname__}.output_dir: not set; shards need a folder to go to")
    indices = check_indices(indices, type(runner).__qualname__)
    batch_size = check_batch_size(getattr(runner, "batch_size", None))
    layout = StageLayout(Path(runner.output_dir), str(getattr(runner, "shard_subdir", "") or ""))
    shards = plan_shards("local", len(indices), default_num_shards(len(indices), 1, batch_size), batch_size,
                         indices=indices)
    remove_stale(layout, len(shards))
    layout.root.mkdir(parents=True, exist_ok=True)
    write_manifest(layout.manifest, str(runner.output_dir), layout.shard_subdir, shards)
    fingerprint, identity = runner_fingerprint(runner, indices, batch_size)
    env = None
    for shard in shards:
        expect = {"fingerprint": fingerprint, "start": shard.start, "stop": shard.stop}
        if getattr(runner, "resume", True) and check_marker(layout.shard_dir(shard.index), expect) is None:
            continue
        if env is None:
            provider = getattr(runner, "provider", None)
            env = dict(provider.build_env_local()) if provider is not None else {}
            env.setdefault("output_dir", str(runner.output_dir))
            if layout.shard_subdir:
                env.setdefault("shard_subdir", layout.shard_subdir)
        run_shard(type(runner), shard, env, layout, marker={"fingerprint": fingerprint, "identity": identity})
    return runner.merge([layout.shard_dir(s.index) for s in shards])

