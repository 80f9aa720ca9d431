"""``espnet3-prefect``: run ESPnet3 stages as Prefect flows from the shell.

    espnet3-prefect infer --config conf/inference.yaml [deployments/parallel_local.yaml] [key=value ...]

Also ``metrics``, ``evaluate``, ``deploy-local`` and ``infer --detach`` (espnet3_prefect/cli_deploy.py).

Without ``PREFECT_API_URL`` it starts (or reuses) one local Prefect server on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Sequence

from .errors import Espnet3PrefectError, one_line


def split_args(items: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate config files from overrides (``key=value``, ``+key=value``, ``~key``).

    >>> split_args(["a.yaml", "parallel.n_workers=2", "b.yml", "~x"])
    (['a.yaml', 'b.yml'], ['parallel.n_workers=2', '~x'])
    """
    configs, overrides = [], []
    for item in items:
        (overrides if ("=" in item or item.startswith("~")) else configs).append(item)
    return configs, overrides


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="espnet3-prefect", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    infer = sub.add_parser("infer", help="run the infer stage (flow 'infer')")
    infer.add_argument("--config", nargs="+", required=True, metavar="FILE_OR_OVERRIDE",
                       help="config files merged left to right, then key=value overrides")
    infer.add_argument("extra", nargs="*", help="more config files or key=value overrides")
    infer.add_argument("--state-dir", default=None,
                       help="embedded server state (default $ESPNET3_PREFECT_HOME or ~/.espnet3-prefect)")
    infer.add_argument("--keep-server", action="store_true",
                       help="leave the embedded Prefect server running (to browse the UI afterwards)")
    from .cli_cluster import add_cluster_script_parser
    from .cli_deploy import register

    register(sub, infer)  # metrics, evaluate, deploy-local, infer --detach
    add_cluster_script_parser(sub)
    return parser


def _export_pythonpath() -> None:
    """Recipe modules (``src.inference.MyProvider``) import on workers, also in batch jobs."""
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if cwd not in parts:
        os.environ["PYTHONPATH"] = os.pathsep.join([cwd, *parts])


def run_infer(args: argparse.Namespace) -> int:
    from .config import load_config
    from .stage import prepare_stages

    configs, overrides = split_args([*args.config, *args.extra])
    prepare_stages(load_config(configs, overrides))  # every config error, before any server starts
    from .report import format_summary
    from .server import prefect_api

    with prefect_api(args.state_dir, keep=args.keep_server) as api_url:
        from .flows.infer import infer

        print(f"Prefect API: {api_url}", file=sys.stderr)
        summaries = infer(config=[str(Path(c)) for c in configs], overrides=overrides)
    print(format_summary(summaries))
    return 0


def _terminate_cleanly(signum, frame) -> None:
    """SIGTERM (scancel, kill, a deployment's cancel) unwinds like Ctrl-C: the server we started stops."""
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate_cleanly)
    _export_pythonpath()
    try:
        if hasattr(args, "run"):  # cluster-script
            return args.run(args)
        if args.command != "infer" or args.detach:
            from .cli_deploy import dispatch

            return dispatch(args)
        return run_infer(args)
    except Espnet3PrefectError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    except KeyboardInterrupt:
        print("error: interrupted; finished shards are kept and a re-run resumes from them", file=sys.stderr)
        return 130
    except Exception as exc:  # a failed flow run: Prefect already logged the details
        print(f"error: {type(exc).__name__}: {one_line(exc)}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
