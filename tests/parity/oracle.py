"""The parity oracle: run the real ESPnet3 202611 ``infer()`` or ``measure()`` on a config.

Runs only in ``.venv-parity`` (``bash scripts/parity_setup.sh``), from the repository root::

    .venv-parity/bin/python -m tests.parity.oracle infer --config A.yaml [B.yaml] [key=value ...]
    .venv-parity/bin/python -m tests.parity.oracle measure --config M.yaml \
        [--inference-config I.yaml] [key=value ...]

Each file is loaded the way ESPnet3's own loader loads it
(``espnet3.utils.config_utils.load_config_with_defaults(path, resolve=False)``: ``defaults:``
lists, ``${self_name:}`` bound to that file's stem), the files are merged left to right, then the
overrides apply (``a.b=1``, ``+a.b=1``, ``~a.b``, read with Hydra's override grammar, as a command
line of ours reads them), then interpolations resolve.

For ``infer`` the ``parallel`` block becomes ``{env: local, n_workers: 1, options: {processes:
false, threads_per_worker: 1, dashboard_address: null}}``: an in-process LocalCluster on Dask's
inproc transport, nothing on the network (the config's
``allow_overwrite_lock`` is kept; ``parallel.*`` overrides still apply; ``--keep-parallel``
leaves the config's block alone). Upstream always goes through a Dask ``LocalCluster``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

ROOT = Path(__file__).resolve().parents[2]
# The worker runs in the oracle's own process (processes: False): the same LocalCluster, scheduler,
# WorkerPlugin and task path, without spawning a process that imports torch again (the oracle
# runs dozens of times per parity session on a 2-core machine). In-process clusters talk over
# Dask's inproc:// transport, so nothing listens on the network; the dashboard is off.
LOOPBACK_OPTIONS = {"processes": False, "threads_per_worker": 1, "dashboard_address": None}


def _importable_everywhere() -> None:
    """Recipe modules (``tests.parity.recipes...``) import here and on the Dask workers."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(ROOT) not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *parts])


def split_args(items: Sequence[str]) -> tuple[list[str], list[str]]:
    configs, overrides = [], []
    for item in items:
        (overrides if ("=" in item or item.startswith("~")) else configs).append(item)
    return configs, overrides


def parse_override(item: str) -> tuple[bool, str, Any]:
    """``(delete, key, value)`` of one override, read with Hydra's override grammar and its value
    typed as Hydra types it (``k=yes`` the string ``'yes'``, ``k=1e-3`` a float, ``k='12'`` a string).

    Hydra's own parser, not ``espnet3_prefect``'s: the oracle shares no code with what it checks.

    >>> parse_override("+model.ctc_weight=2e-1"), parse_override("k=yes"), parse_override("k='1e10000000000000'")
    ((False, 'model.ctc_weight', 0.2), (False, 'k', 'yes'), (False, 'k', '1e10000000000000'))
    >>> parse_override("d='/exp/modèle, v2 (x)/~y'"), parse_override("k="), parse_override("~a.b")
    ((False, 'd', '/exp/modèle, v2 (x)/~y'), (False, 'k', ''), (True, 'a.b', None))
    >>> parse_override("k=1,2")
    Traceback (most recent call last):
    ...
    ValueError: oracle: override 'k=1,2': one value per key (no sweep, no @package)
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType

    [parsed] = OverridesParser.create().parse_overrides([item])
    if parsed.package is not None or parsed.value_type not in (None, ValueType.ELEMENT):
        raise ValueError(f"oracle: override {item!r}: one value per key (no sweep, no @package)")
    value = parsed.value() if parsed.value_type is not None else None
    return parsed.is_delete(), parsed.key_or_group, value


def apply_override(cfg: DictConfig, item: str) -> None:
    """Apply one override in place: ``~key`` deletes a key that is there, any other sets (or adds) it.

    >>> cfg = OmegaConf.create({"a": {"b": 1}})
    >>> for item in ("a.b=0017", "+c='1234567890123456'", "+d=[1, x]", "~a"):
    ...     apply_override(cfg, item)
    >>> OmegaConf.to_container(cfg)
    {'c': '1234567890123456', 'd': [1, 'x']}
    """
    delete, key, value = parse_override(item)
    if delete:
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        if node is not None and leaf in node:
            del node[leaf]
        return
    OmegaConf.update(cfg, key, value, merge=False, force_add=True)


def load(paths: Sequence[str], overrides: Sequence[str] = (), resolve: bool = True) -> DictConfig:
    """Upstream's per-file loader, merged left to right, then overrides, then resolution."""
    from espnet3.utils.config_utils import load_config_with_defaults

    cfg = OmegaConf.create({})
    for path in paths:
        cfg = OmegaConf.merge(cfg, load_config_with_defaults(str(path), resolve=False))
    for item in overrides:
        apply_override(cfg, item)
    if resolve:
        OmegaConf.resolve(cfg)
    return cfg


def loopback_parallel(cfg: DictConfig, overrides: Sequence[str]) -> None:
    """A one-worker loopback LocalCluster, keeping the config's allow_overwrite_lock."""
    old = cfg.get("parallel") or {}
    block = {"env": "local", "n_workers": 1, "options": dict(LOOPBACK_OPTIONS)}
    if "allow_overwrite_lock" in old:
        block["allow_overwrite_lock"] = old["allow_overwrite_lock"]
    cfg.parallel = block
    for item in overrides:
        if item.lstrip("+~").startswith("parallel."):
            apply_override(cfg, item)


def run_infer(args: argparse.Namespace) -> None:
    from espnet3.systems.base.inference import infer

    configs, overrides = split_args([*args.config, *args.extra])
    cfg = load(configs, overrides)
    if not args.keep_parallel:
        loopback_parallel(cfg, overrides)
    infer(cfg)


def run_measure(args: argparse.Namespace) -> None:
    from espnet3.systems.base.metric import measure

    configs, overrides = split_args([*args.config, *args.extra])
    mcfg = load(configs, overrides)
    icfg = None
    if args.inference_config:
        iconfigs, ioverrides = split_args(args.inference_config)
        icfg = load(iconfigs, ioverrides)
    measure(mcfg, inference_config=icfg)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.parity.oracle", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    infer = sub.add_parser("infer", help="espnet3.systems.base.inference.infer(config)")
    infer.add_argument("--config", nargs="+", required=True, metavar="FILE_OR_OVERRIDE")
    infer.add_argument("--keep-parallel", action="store_true", help="use the config's parallel block as is")
    infer.add_argument("extra", nargs="*", help="more config files or key=value overrides")
    measure = sub.add_parser("measure", help="espnet3.systems.base.metric.measure(metrics_config, inference_config)")
    measure.add_argument("--config", nargs="+", required=True, metavar="FILE_OR_OVERRIDE")
    measure.add_argument(
        "--inference-config",
        nargs="+",
        default=None,
        metavar="FILE_OR_OVERRIDE",
        help="the inference config (files and overrides), for dataset:<column> inputs",
    )
    measure.add_argument("extra", nargs="*", help="more config files or key=value overrides")
    args = parser.parse_args(argv)

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _importable_everywhere()
    try:
        import espnet3  # noqa: F401
    except ImportError:
        print(
            "oracle: espnet3 is not importable; run it with .venv-parity/bin/python (bash scripts/parity_setup.sh)",
            file=sys.stderr,
        )
        return 3
    started = time.perf_counter()
    (run_infer if args.command == "infer" else run_measure)(args)
    print(f"oracle: {args.command} ok in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
