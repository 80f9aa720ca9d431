"""``espnet3-prefect infer`` against ESPnet3's plain-Dask design, each a fresh process, as a user runs them.

    .venv/bin/python -m benchmarks.cli_runs plain CONFIG N_ITEMS NUM_SHARDS OUT   # the plain-Dask side

:func:`compare` runs, in turns, ``python -m benchmarks.cli_runs plain ...`` (imports, config,
LocalCluster with 2 spawned workers, ``client.map`` over the shards: :func:`benchmarks.baselines.plain_dask`)
and ``espnet3-prefect infer --config ...`` on the synthetic 10k x 3 ms stage, the CLI on the Prefect
server this process runs (``$PREFECT_API_URL``: a kept or shared server, as ``deploy-local`` or
``--keep-server`` leave one). Each side's wall time includes its interpreter start and imports.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from . import baselines, synthetic

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, capture_output=True)
    return time.perf_counter() - started


def compare(work: Path, n: int, num_shards: int, rounds: int = 2) -> dict[str, list[float]]:
    """Seconds of each side, ``rounds`` times, in turns (load from other processes falls on both alike)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    times: dict[str, list[float]] = {"plain": [], "cli": []}
    for i in range(rounds):
        for side in ("plain", "cli") if i % 2 == 0 else ("cli", "plain"):
            name = f"cli_{side}{i}"
            config = work / f"{name}.yaml"
            shards = num_shards if side == "plain" else None  # the CLI plans the same count itself
            config.write_text(yaml.safe_dump(synthetic.config(str(work / name), n, 3.0, 2, shards)))
            if side == "plain":
                cmd = [sys.executable, "-m", "benchmarks.cli_runs", "plain", str(config), str(n), str(num_shards)]
                times[side].append(_run([*cmd, str(work / f"{name}_out")], env))
            else:
                times[side].append(
                    _run([str(Path(sys.executable).parent / "espnet3-prefect"), "infer", "--config", str(config)], env)
                )
    return times


def _plain(config: str, n: int, num_shards: int, out: str) -> None:
    from espnet3_prefect.config.load import load_config
    from espnet3_prefect.pipeline.stage import build_stages

    stage = build_stages(load_config([config]))[1][0]
    baselines.plain_dask(stage, n, 2, num_shards, Path(out))


if __name__ == "__main__":
    if sys.argv[1:2] != ["plain"] or len(sys.argv) != 6:
        raise SystemExit(__doc__)
    _plain(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
