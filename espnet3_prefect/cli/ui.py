"""``ui``: serve a project's recorded Prefect state again and print its runs' links.

    espnet3-prefect ui                          # this project's server (its last port), recent runs
    espnet3-prefect ui exp/dtmf/inference       # also: the runs that wrote these outputs
    espnet3-prefect ui --keep-server            # leave it running and return (stop: servers --stop)

The state dir keeps the server's database (every run of the project) and its port, so a link a past
run printed ("View at http://127.0.0.1:<port>/runs/flow-run/<id>") opens again while this serves.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from espnet3_prefect.server.state_home import STATE_DIR_HELP


def register(sub) -> None:
    ui = sub.add_parser("ui", help="serve the project's recorded runs in the Prefect UI and print their links")
    ui.add_argument(
        "target",
        nargs="?",
        default=None,
        help="a stage's output folder (also lists the runs that wrote it), a project folder or a "
        "state dir (default: the current project)",
    )
    ui.add_argument("--state-dir", default=None, help=STATE_DIR_HELP)
    ui.add_argument(
        "--keep-server",
        action="store_true",
        help="print the links and return, leaving the server running (else: serve until Ctrl-C)",
    )
    ui.add_argument("--limit", type=int, default=10, help="how many recent runs to list (default 10)")
    ui.set_defaults(handler=run_ui)


def choose_state_dir(target: str | None, state_dir: str | None) -> Path:
    """``--state-dir``; else ``target`` when it is a state dir; else ``$ESPNET3_PREFECT_HOME``; else the
    state dir of ``target``'s project (default: the current folder's), as the runs chose it."""
    from espnet3_prefect.server.state_home import PREFECT_HOME_DIR, default_state_dir
    from espnet3_prefect.server.state_home import state_dir as make_state_dir

    if state_dir:
        return make_state_dir(state_dir)
    if target and (Path(target) / PREFECT_HOME_DIR).is_dir():
        return make_state_dir(target)
    if os.environ.get("ESPNET3_PREFECT_HOME") or not target:
        return make_state_dir(None)
    return make_state_dir(default_state_dir(target))


def run_ui(args: argparse.Namespace) -> int:
    from espnet3_prefect.cli.common import describe_api, print_kept_server
    from espnet3_prefect.errors import ConfigError
    from espnet3_prefect.server.embedded import prefect_api
    from espnet3_prefect.server.run_links import describe_runs, writer_runs

    if args.target and not Path(args.target).is_dir():
        raise ConfigError(f"ui: {args.target} is not a folder (a stage's output folder, a project or a state dir)")
    home = choose_state_dir(args.target, args.state_dir)
    writers = writer_runs([Path(args.target)]) if args.target else []
    with prefect_api(home, keep=args.keep_server) as api_url:
        ui_url = api_url[: -len("/api")]
        print(describe_api(api_url), file=sys.stderr)
        print(f"Prefect UI: {ui_url} (state {home})")
        if writers:
            print(f"the runs that wrote {args.target} (last: the one that finished it):")
            print("\n".join(link.line(ui_url) for link in describe_runs(writers)))
        recent = describe_runs(limit=args.limit)
        print("recent flow runs:" if recent else "no flow runs recorded yet")
        print("\n".join(link.line(ui_url) for link in recent))
        sys.stdout.flush()
        if args.keep_server:
            print_kept_server(api_url)
            return 0
        print("serving until Ctrl-C", file=sys.stderr, flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            print("stopped the Prefect server", file=sys.stderr)
    return 0
