"""Feature extraction + global statistics over the DTMF demo audio, the ESPnet3 developer way:
build a provider and a runner, register the ``parallel`` block, call ``runner(range(n))``.

    python -m dtmf_demo.stats --config recipes/dtmf/conf/stats.yaml [deployments/parallel_slurm.yaml] [key=value ...]

With a ``parallel`` block (the config's, or an override file's) the call is a run of the Prefect flow
``run-runner`` (flow run ``FeatsRunner``) on that Dask backend; ``~parallel`` runs it in this process.
The demo audio is generated first when missing. Outputs under ``stats_dir``: ``feats.scp``,
``feats_shape``, ``feats_stats.npz``, ``stats.json`` and ``split.N/feats/*.npy`` (see
:mod:`dtmf_demo.feats`). A second run finds every shard done and only merges.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from omegaconf import OmegaConf

from dtmf_demo.feats import FeatsProvider, FeatsRunner, mean_std_line
from dtmf_demo.recipe import DTMFOrganizer
from espnet3_prefect.config.load import load_config
from espnet3_prefect.errors import Espnet3PrefectError, one_line
from espnet3_prefect.execution.process_parallel import set_parallel


def build(cfg) -> tuple[FeatsRunner, int]:
    """The runner for ``cfg`` and the number of utterances (the demo audio is made when missing)."""
    data = OmegaConf.to_container(cfg.data, resolve=True)
    DTMFOrganizer.ensure_prepared(test=data)
    provider = FeatsProvider({"data": data, "features": OmegaConf.to_container(cfg.features, resolve=True)})
    runner = FeatsRunner(
        provider,
        batch_size=cfg.get("batch_size"),
        output_dir=cfg.stats_dir,
        resume=bool(OmegaConf.select(cfg, "runner.resume", default=True)),
    )
    return runner, len(FeatsProvider.build_dataset(provider.config))


def main(argv: Sequence[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(prog="python -m dtmf_demo.stats", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", nargs="+", required=True, help="config files, merged left to right")
    parser.add_argument("overrides", nargs="*", help="key=value overrides (~parallel: run in this process)")
    args = parser.parse_args(argv)
    items = [*args.config, *args.overrides]  # as the CLI: key=value / ~key are overrides, the rest files
    overrides = [i for i in items if "=" in i or i.startswith("~")]
    try:
        cfg = load_config([i for i in items if i not in overrides], overrides)
        runner, n_items = build(cfg)
        if cfg.get("parallel") is not None:
            set_parallel(cfg.parallel)
        where = (
            f"parallel env={cfg.parallel.env} n_workers={cfg.parallel.n_workers}"
            if cfg.get("parallel")
            else "in this process"
        )
        started = time.perf_counter()
        result = runner(range(n_items))
        seconds = time.perf_counter() - started
    except Espnet3PrefectError as exc:
        print(f"error: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
        raise SystemExit(2) from None
    print(
        f"{result['utterances']} utterances, {result['frames']} frames x {len(result['mean'])} log-mel dims "
        f"in {seconds:.1f} s ({where})"
    )
    print(mean_std_line(result))
    print(f"feats: {result['feats_scp']}\nstats: {result['stats']}")
    return result


if __name__ == "__main__":
    main()
