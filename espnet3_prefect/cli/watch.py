"""``watch-checkpoints``: send one ``espnet3.checkpoint.saved`` event per new, complete checkpoint.

Usage: ``espnet3-prefect watch-checkpoints exp/asr_train [--pattern '**/*.ckpt'] [--mode all|latest]``
(docs/checkpoints.md).
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from espnet3_prefect.checkpoints.poller import DEFAULT_PATTERNS, MODES


def register(sub) -> None:
    watch = sub.add_parser(
        "watch-checkpoints",
        help="watch an experiment folder; send one checkpoint event per new checkpoint "
        "(the evaluate/checkpoint deployment's trigger)",
    )
    watch.add_argument("exp_dir", help="the experiment folder to watch (recursively)")
    watch.add_argument(
        "--pattern",
        action="append",
        default=None,
        metavar="GLOB",
        help=f"files to watch, relative to exp_dir; repeatable (default {' '.join(DEFAULT_PATTERNS)})",
    )
    watch.add_argument(
        "--mode",
        choices=MODES,
        default="all",
        help="all: one event per new checkpoint, oldest first; latest: only the newest of those "
        "complete at one look (default %(default)s)",
    )
    watch.add_argument(
        "--settle-s",
        type=float,
        default=10.0,
        help="a file that is not a closed zip (torch.save) archive is complete once its size and "
        "mtime stayed the same this long (default %(default)s)",
    )
    watch.add_argument("--poll-s", type=float, default=1.0, help="seconds between looks (default %(default)s)")
    watch.add_argument(
        "--state-file",
        default=None,
        help="where the hashes already sent are kept (default <exp_dir>/.espnet3-checkpoints.json)",
    )
    watch.add_argument("--once", action="store_true", help="look once, send what is complete, and exit")
    watch.add_argument(
        "--state-dir",
        default=None,
        help="without PREFECT_API_URL: the state dir of the server deploy-local left running",
    )
    watch.set_defaults(handler=watch_checkpoints)


def watch_checkpoints(args: argparse.Namespace) -> int:
    from espnet3_prefect.checkpoints.events import EmittedState, prefect_settings, state_path
    from espnet3_prefect.checkpoints.poller import Watcher
    from espnet3_prefect.server.registry import find_api

    exp_dir = Path(args.exp_dir).expanduser()
    creds = find_api(args.state_dir)
    api_url = creds.api_url
    with prefect_settings(creds), EmittedState(state_path(exp_dir, args.state_file)) as state:
        _log_to_stderr()  # after Prefect set up its logging (which turns off loggers made before it)
        watcher = Watcher(exp_dir, state, tuple(args.pattern or DEFAULT_PATTERNS), args.mode, args.settle_s)
        print(
            f"watching {watcher.exp_dir} ({', '.join(watcher.patterns)}; mode {args.mode}); events to {api_url}; "
            f"state {state.path}",
            file=sys.stderr,
            flush=True,
        )
        if args.once:
            state.flush_pending()
            watcher.poll()
            return 0
        watcher.run(args.poll_s)
    return 0


def _log_to_stderr() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    log = logging.getLogger("espnet3_prefect.watch")
    log.disabled, log.propagate = False, False
    log.handlers = [handler]
    log.setLevel(logging.INFO)
