"""A recipe ``run.py`` in miniature: its infer and measure stages, switched to Prefect by one import.

    python -m tests.parity.dropin_run --config conf/inference.yaml [k=v ...] \
        --metrics-config conf/metrics.yaml [k=v ...] [--impl espnet3]

With ``--impl espnet3`` the same two calls go to ESPnet3's own functions (the line a recipe
changes); by default to ``espnet3_prefect.infer`` / ``espnet3_prefect.measure``, which take
upstream's signatures: ``infer(config)`` and ``measure(metrics_config, inference_config=None)``.
Configs load with plain OmegaConf, as a run.py without espnet3 installed would.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml
from omegaconf import OmegaConf

ROOT = Path(__file__).resolve().parents[2]


def load(items: Sequence[str]):
    files = [i for i in items if "=" not in i]
    cfg = OmegaConf.merge(*[OmegaConf.load(f) for f in files])
    for item in items:
        if "=" in item:
            key, value = item.split("=", 1)
            OmegaConf.update(cfg, key.lstrip("+"), yaml.safe_load(value), merge=False, force_add=True)
    OmegaConf.resolve(cfg)
    return cfg


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", nargs="+", required=True)
    parser.add_argument("--metrics-config", nargs="+", required=True)
    parser.add_argument("--impl", choices=("espnet3_prefect", "espnet3"), default="espnet3_prefect")
    args = parser.parse_args(argv)
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    if args.impl == "espnet3":
        from espnet3.systems.base.inference import infer
        from espnet3.systems.base.metric import measure
    else:
        from espnet3_prefect import infer, measure

    inference_config = load(args.config)
    metrics_config = load(args.metrics_config)
    infer(inference_config)
    results = measure(metrics_config, inference_config=inference_config)
    print(f"dropin: measure returned {results!r}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
