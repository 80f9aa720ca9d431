"""What the subcommands share: their config arguments, the server options, and the one way a stage
runs from the shell (validate the config, then a Prefect server, then the flow, then print)."""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable, Sequence

from ..server import STATE_DIR_HELP

CONFIG_HELP = "config files merged left to right, then key=value overrides"


def split_args(items: Sequence[str]) -> tuple[list[str], list[str]]:
    """Separate config files from overrides (``key=value``, ``+key=value``, ``~key``).

    >>> split_args(["a.yaml", "parallel.n_workers=2", "b.yml", "~x"])
    (['a.yaml', 'b.yml'], ['parallel.n_workers=2', '~x'])
    """
    configs, overrides = [], []
    for item in items:
        (overrides if ("=" in item or item.startswith("~")) else configs).append(item)
    return configs, overrides


def add_config(parser: argparse.ArgumentParser, flag: str = "--config", help: str = CONFIG_HELP,
               extra: bool = True) -> None:
    """``--config FILE_OR_OVERRIDE...`` (and, with ``extra``, more of them as positional arguments)."""
    parser.add_argument(flag, nargs="+", required=True, metavar="FILE_OR_OVERRIDE", help=help)
    if extra:
        parser.add_argument("extra", nargs="*", help="more config files or key=value overrides")


def configs_of(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """``(config files, overrides)`` from ``--config`` and the positional extras."""
    return split_args([*args.config, *getattr(args, "extra", [])])


def add_server_options(parser: argparse.ArgumentParser, state_dir_help: str = STATE_DIR_HELP,
                       keep: bool = True) -> None:
    """``--state-dir`` (where the embedded server keeps its state), ``--keep-server`` and where the
    embedded server listens (``--server-host``, ``--[no-]server-auth``)."""
    parser.add_argument("--state-dir", default=None, help=state_dir_help)
    if keep:
        parser.add_argument("--keep-server", action="store_true",
                            help="leave the embedded Prefect server running (to browse the UI afterwards)")
        parser.add_argument("--server-host", default=None, metavar="ADDRESS",
                            help="where the embedded Prefect server listens: an address, interface or host name "
                                 "compute nodes reach (default $ESPNET3_PREFECT_SERVER_HOST, else 127.0.0.1); "
                                 "anything but loopback turns on basic auth (README: Security)")
        add_auth_switch(parser, "--server-auth")


def add_auth_switch(parser: argparse.ArgumentParser, flag: str) -> None:
    """``--auth``/``--no-auth`` style switch: None (auth off loopback only), True, False (refused off loopback)."""
    parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=None,
                        help="basic auth for the Prefect API: on by default off loopback, where it cannot be "
                             "turned off; turn it on for 127.0.0.1 too (other users of this machine)")


def describe_api(api_url: str) -> str:
    """``Prefect API: URL`` and, with auth, where the credential is (never the credential)."""
    import os

    from ..util import CLIENT_FILE_VAR

    path = os.environ.get(CLIENT_FILE_VAR)
    return f"Prefect API: {api_url}" + (f" (basic auth; credential in {path}, mode 0600)" if path else "")


class SwitchCommand(argparse.Action):
    """A flag that hands the command to another handler (``infer --detach``, ``deploy-local --stop``)."""

    def __init__(self, option_strings, dest, handler: Callable[[argparse.Namespace], int], **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)
        self.handler = handler

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, True)
        namespace.handler = self.handler


def run_stage(args: argparse.Namespace, *, validate: Callable[[], Any], run: Callable[[], Any],
              show: Callable[[Any], None]) -> int:
    """Validate (every config error before any server starts), then run the flow with a Prefect API
    (``$PREFECT_API_URL`` or the embedded server), then print what it returned."""
    validate()
    from ..server import prefect_api

    api_url = None
    try:
        with prefect_api(args.state_dir, keep=args.keep_server, host=args.server_host,
                         auth=args.server_auth) as api_url:
            print(describe_api(api_url), file=sys.stderr)
            result = run()  # flows are imported by ``run``, once the API is set
    finally:
        if args.keep_server and api_url:  # also after a failed run: its page is what the user wants
            print_kept_server(api_url)
    show(result)
    return 0


def print_kept_server(api_url: str) -> None:
    """Where the server left running is and how to stop it (nothing for a ``$PREFECT_API_URL`` of the user's)."""
    from ..servers import find_servers, kept_server_message

    for server in find_servers(api_url):
        print(kept_server_message(server), file=sys.stderr)
