"""Per-shard orchestration overhead of the infer flow, measured side by side.

    .venv/bin/python -m benchmarks.shard_overhead [--items 640] [--shards 64] [--workers 2] [--api-in-settings-only]

Runs the same zero-cost forward over the same items as 1 shard and as --shards shards, on one
embedded Prefect server and a fresh LocalCluster each; overhead per shard = (t_many - t_one) /
(shards - 1). Also reports a resumed (fully cached) run / first run. ``--api-in-settings-only``
takes PREFECT_API_URL out of the environment the workers inherit (it stays in Prefect's settings),
so the task runner must ship the settings to them.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

from . import synthetic


def _run(work: Path, name: str, cfg: dict) -> tuple[float, dict]:
    from espnet3_prefect.flows.infer import infer

    path = work / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    started = time.perf_counter()
    [summary] = infer(config=[str(path)])
    return time.perf_counter() - started, summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=640)
    parser.add_argument("--shards", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--api-in-settings-only", action="store_true")
    args = parser.parse_args()
    import os

    from espnet3_prefect.server.embedded import prefect_api

    with tempfile.TemporaryDirectory() as tmp, prefect_api(Path(tmp) / "home", ui=False):
        if args.api_in_settings_only:
            os.environ.pop("PREFECT_API_URL")  # prefect_api restores it on the way out
        work = Path(tmp)
        one, _ = _run(work, "one", synthetic.config(str(work / "a"), args.items, 0.0, args.workers, 1))
        many, _ = _run(work, "many", synthetic.config(str(work / "b"), args.items, 0.0, args.workers, args.shards))
        again, s = _run(work, "many", synthetic.config(str(work / "b"), args.items, 0.0, args.workers, args.shards))
    per_shard = (many - one) / (args.shards - 1)
    print(f"flow wall, 1 shard:          {one:7.2f} s")
    print(f"flow wall, {args.shards} shards:        {many:7.2f} s")
    print(
        f"overhead per extra shard:    {per_shard * 1000:7.1f} ms  "
        f"({args.workers} workers, {args.items} items, zero-cost forward)"
    )
    print(f"resumed run ({s['shards_cached']} cached):    {again:7.2f} s  = {again / many:.2f} x the first run")


if __name__ == "__main__":
    main()
