"""``servers``: list the Prefect servers espnet3-prefect left running, from any folder, and stop them.

espnet3-prefect servers                       # pid, UI, started, state dir, who uses it
espnet3-prefect servers --stop http://127.0.0.1:4200   # or a pid, a flow-run URL, a state dir, all
"""

from __future__ import annotations

import argparse


def register(sub) -> None:
    servers = sub.add_parser("servers", help="list (or stop) the Prefect servers espnet3-prefect left running")
    servers.add_argument(
        "--stop",
        metavar="TARGET",
        default=None,
        help="stop the server(s) TARGET names: a pid, any URL on the server (UI, API, a "
        "flow-run page), its state dir, or 'all'; deploy-local's worker goes with its server",
    )
    servers.add_argument(
        "--force", action="store_true", help="also stop a server another espnet3-prefect process is using now"
    )
    servers.set_defaults(handler=run_servers)


def run_servers(args: argparse.Namespace) -> int:
    from espnet3_prefect.server.registry import find_servers, format_servers, list_servers, stop_servers

    if args.stop is None:
        print(format_servers(list_servers()))
        return 0
    if not find_servers(args.stop):
        print(f"no running espnet3-prefect server matches {args.stop!r}")
        print(format_servers(list_servers()))
        return 1
    outcome = stop_servers(args.stop, force=args.force)
    for server in outcome.stopped:
        extra = f" and its worker (pid {server.worker_pid})" if server.worker_pid else ""
        print(f"stopped the server at {server.ui_url} (pid {server.pid}){extra}")
    for server in outcome.busy:
        print(
            f"left running: {server.ui_url} (pid {server.pid}) is in use by pid "
            f"{' '.join(map(str, server.users()))}; --force stops it anyway"
        )
    return 0 if not outcome.busy else 1
