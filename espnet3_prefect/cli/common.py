"""What the subcommands share: their config arguments, the server options, and the one way a stage
runs from the shell (validate the config, then a Prefect server, then the flow, then print)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from espnet3_prefect.server.state_home import STATE_DIR_HELP

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


def add_config(
    parser: argparse.ArgumentParser, flag: str = "--config", help: str = CONFIG_HELP, extra: bool = True
) -> None:
    """``--config FILE_OR_OVERRIDE...`` (and, with ``extra``, more of them as positional arguments)."""
    parser.add_argument(flag, nargs="+", required=True, metavar="FILE_OR_OVERRIDE", help=help)
    if extra:
        parser.add_argument("extra", nargs="*", help="more config files or key=value overrides")


def configs_of(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """``(config files, overrides)`` from ``--config`` and the positional extras."""
    return split_args([*args.config, *getattr(args, "extra", [])])


def add_server_options(
    parser: argparse.ArgumentParser, state_dir_help: str = STATE_DIR_HELP, keep: bool = True
) -> None:
    """``--state-dir`` (where the embedded server keeps its state), ``--keep-server`` and where the
    embedded server listens (``--server-host``, ``--[no-]server-auth``, ``--[no-]server-tls``)."""
    parser.add_argument("--state-dir", default=None, help=state_dir_help)
    if keep:
        parser.add_argument(
            "--keep-server",
            action="store_true",
            help="leave the embedded Prefect server running (to browse the UI afterwards)",
        )
        parser.add_argument(
            "--server-host",
            default=None,
            metavar="ADDRESS",
            help="where the embedded Prefect server listens: an address, interface or host name "
            "compute nodes reach (default $ESPNET3_PREFECT_SERVER_HOST, else 127.0.0.1); "
            "anything but loopback turns on basic auth and HTTPS (docs/security.md)",
        )
        add_auth_switch(parser, "--server-auth")
        add_tls_switch(parser, "--server-tls")


def add_auth_switch(parser: argparse.ArgumentParser, flag: str) -> None:
    """``--auth``/``--no-auth`` style switch: None (auth off loopback only), True, False (refused off loopback)."""
    parser.add_argument(
        flag,
        action=argparse.BooleanOptionalAction,
        default=None,
        help="basic auth for the Prefect API: on by default off loopback, where it cannot be "
        "turned off; turn it on for 127.0.0.1 too (other users of this machine)",
    )


def add_tls_switch(parser: argparse.ArgumentParser, flag: str) -> None:
    """``--tls``/``--no-tls`` style switch: None (HTTPS off loopback only), True, False (plain HTTP;
    refused off loopback together with auth off)."""
    parser.add_argument(
        flag,
        action=argparse.BooleanOptionalAction,
        default=None,
        help="HTTPS for the Prefect API, with a certificate made for this server start: on by "
        "default off loopback (turning it off there sends the credential in clear); "
        "turn it on for 127.0.0.1 too",
    )


def describe_api(api_url: str) -> str:
    """``Prefect API: URL`` and, with HTTPS, the certificate it is verified with, with auth, where the
    credential is (never the credential)."""
    from espnet3_prefect._internal.util import CLIENT_FILE_VAR

    notes = []
    if api_url.startswith("https://") and os.environ.get("PREFECT_API_SSL_CERT_FILE"):
        notes.append(f"HTTPS, verified with {os.environ['PREFECT_API_SSL_CERT_FILE']}")
    path = os.environ.get(CLIENT_FILE_VAR)
    if path and (os.environ.get("PREFECT_API_AUTH_STRING") or os.environ.get("PREFECT_API_KEY")):
        notes.append(f"basic auth; credential in {path}, mode 0600")
    return f"Prefect API: {api_url}" + (f" ({'; '.join(notes)})" if notes else "")


def add_verbose(parser: argparse.ArgumentParser) -> None:
    """``--verbose``: every Prefect line on the terminal (by default a shard shows one line)."""
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="show every Prefect log line (also each task run's 'Finished in state ...')",
    )


class SwitchCommand(argparse.Action):
    """A flag that hands the command to another handler (``infer --detach``, ``deploy-local --stop``)."""

    def __init__(self, option_strings, dest, handler: Callable[[argparse.Namespace], int], **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=False, **kwargs)
        self.handler = handler

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, True)
        namespace.handler = self.handler


def run_stage(
    args: argparse.Namespace,
    *,
    validate: Callable[[], Any],
    run: Callable[[], Any],
    show: Callable[[Any], None],
    settled: Callable[[], Any] | None = None,
    writers: Callable[[], list[str]] | None = None,
    starting: Callable[[], Callable[[dict], None]] | None = None,
) -> int:
    """Validate (every config error before any server starts), then run the flow with a Prefect API
    (``$PREFECT_API_URL`` or the embedded server), then print what it returned.

    ``settled``, when given, answers without a server: it returns what ``run`` would (e.g. every test
    set already done and verified), or None when there is work. With ``--keep-server`` a settled stage
    starts the server and points at the flow runs that wrote its outputs (``writers``: their ids,
    the finishing one last); without ``writers``, or none recorded, it runs the flow. ``starting``,
    when given, makes the hook that runs beside the server's start (``prefect_api(starting=...)``)."""
    if getattr(args, "verbose", False):
        from espnet3_prefect.pipeline.report import VERBOSE_ENV

        os.environ[VERBOSE_ENV] = "1"  # workers started from here inherit it
    validate()
    result = settled() if settled is not None else None
    if result is not None and not args.keep_server:
        print("nothing to run: every test set is done and verified (no server started, no flow run)", file=sys.stderr)
        show(result)
        return 0
    if result is not None and writers is not None and writers():
        return _show_writers(args, writers(), lambda: show(result))
    from espnet3_prefect.server.embedded import prefect_api

    api_url = None
    try:
        with prefect_api(
            args.state_dir,
            keep=args.keep_server,
            host=args.server_host,
            auth=args.server_auth,
            tls=args.server_tls,
            starting=starting() if starting is not None and result is None else None,
            watch=True,
            rerun=getattr(args, "rerun", None),
        ) as api_url:
            print(describe_api(api_url), file=sys.stderr)
            result = run()  # flows are imported by ``run``, once the API is set
    finally:
        if args.keep_server and api_url:  # also after a failed run: its page is what the user wants
            print_kept_server(api_url)
    show(result)
    return 0


def _show_writers(args: argparse.Namespace, ids: list[str], show: Callable[[], None]) -> int:
    """``--keep-server`` on a finished stage: the server, left running, and the runs that wrote it."""
    from espnet3_prefect.server.embedded import prefect_api
    from espnet3_prefect.server.run_links import describe_runs

    with prefect_api(args.state_dir, keep=True, host=args.server_host, auth=args.server_auth) as api_url:
        print(describe_api(api_url), file=sys.stderr)
        print(
            "nothing to run: every test set is done and verified; the flow run(s) that wrote the outputs "
            "(last: the one that finished them):",
            file=sys.stderr,
        )
        print("\n".join(link.line(api_url[: -len("/api")]) for link in describe_runs(ids)), file=sys.stderr)
    print_kept_server(api_url)
    show()
    return 0


@contextmanager
def console_skips_summary() -> Iterator[None]:
    """Keep a flow's closing summary out of the terminal's log lines while the CLI runs it (the lines
    logged with ``report.CONSOLE_OFF``): the CLI prints it on stdout itself, the flow-run log (the UI)
    keeps its copy."""
    import prefect.main  # noqa: F401 - sets up Prefect's logging (its console handler) if nothing has yet

    from espnet3_prefect.pipeline.report import drop_from_console

    handlers = [
        h
        for name in ("", "prefect")
        for h in logging.getLogger(name).handlers
        if type(h).__name__ == "PrefectConsoleHandler"
    ]
    for handler in handlers:
        handler.addFilter(drop_from_console)
    try:
        yield
    finally:
        for handler in handlers:
            handler.removeFilter(drop_from_console)


def print_kept_server(api_url: str) -> None:
    """Where the server left running is and how to stop it (nothing for a ``$PREFECT_API_URL`` of the user's)."""
    from espnet3_prefect.server.registry import find_servers, kept_server_message

    for server in find_servers(api_url):
        print(kept_server_message(server), file=sys.stderr)
