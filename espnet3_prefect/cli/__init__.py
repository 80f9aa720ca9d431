"""``espnet3-prefect``: run ESPnet3 stages as Prefect flows from the shell.

    espnet3-prefect infer --config conf/inference.yaml [deployments/parallel_local.yaml] [key=value ...]

Also ``metrics``, ``evaluate`` (:mod:`.stages`), ``run`` (an ESPnet3 recipe's launcher, :mod:`.recipe`),
``infer --detach`` (:mod:`.detach`),
``deploy-local`` (:mod:`.deploy`), ``watch-checkpoints`` (:mod:`.watch`), ``cluster-script``
(:mod:`.cluster_script`), ``servers`` (:mod:`.servers`) and ``ui`` (:mod:`.ui`). Each module
registers its subcommands with a ``handler``; :func:`main` parses once and calls it.

Without ``PREFECT_API_URL`` it starts (or reuses) one local Prefect server on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
from collections.abc import Sequence

from espnet3_prefect._internal.util import put_on_pythonpath
from espnet3_prefect.cli import cluster_script, deploy, detach, recipe, servers, stages, ui, watch
from espnet3_prefect.cli.common import split_args
from espnet3_prefect.errors import Espnet3PrefectError, one_line
from espnet3_prefect.server.watch import ServerGoneError

__all__ = ["build_parser", "main", "split_args"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="espnet3-prefect", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    infer = stages.register(sub)  # infer, metrics, evaluate
    detach.register(infer)  # infer --detach
    recipe.register(sub)  # run (ESPnet3's launcher arguments, passed through)
    deploy.register(sub)  # deploy-local [--stop]
    cluster_script.register(sub)  # cluster-script
    servers.register(sub)  # servers [--stop TARGET]
    watch.register(sub)  # watch-checkpoints EXP_DIR
    ui.register(sub)  # ui [TARGET]: the project's recorded runs, served again
    return parser


def _terminate_cleanly(signum, frame) -> None:
    """SIGTERM (scancel, kill, a deployment's cancel) unwinds like Ctrl-C: the server we started stops."""
    raise KeyboardInterrupt(f"signal {signum}")


class _CtrlC:
    """Ctrl-C, said once: from the interrupt on, what the teardown writes to stderr (Prefect's crash
    report and exit hooks, Dask's cancellations) goes to /dev/null, and :func:`main` writes its one line
    to the stderr saved here. Installed only where SIGINT has Python's default handler (a run started
    with SIGINT ignored, ``nohup ... &``, keeps ignoring it)."""

    saved_fd: int | None = None

    @classmethod
    def install(cls) -> None:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, cls.interrupted)

    @classmethod
    def interrupted(cls, signum, frame) -> None:
        if cls.saved_fd is None:
            sys.stderr.flush()
            cls.saved_fd = os.dup(2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
        raise KeyboardInterrupt

    @classmethod
    def restore(cls) -> None:
        """stderr back to where it was before the interrupt (the handler stays: a second Ctrl-C is quiet too)."""
        if cls.saved_fd is not None:
            sys.stderr.flush()
            os.dup2(cls.saved_fd, 2)
            os.close(cls.saved_fd)
            cls.saved_fd = None


def _leave_now(status: int) -> None:
    """The console script leaves at once. Our servers and clusters are closed by here; Prefect's exit
    hook would wait, without a limit, to send its queued events and logs to a server that is gone (the
    one this run has just stopped, seen hanging after Ctrl-C on Prefect 3.9, or one that died)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def busy_line(exc: BaseException) -> str | None:
    """For a Prefect API call that a busy server kept turning away (429, 503) past the client's retries,
    the line that says so; None for anything else.

    >>> import httpx
    >>> request = httpx.Request("POST", "http://127.0.0.1:4200/api/flow_runs/")
    >>> line = busy_line(httpx.HTTPStatusError("", request=request, response=httpx.Response(503, request=request)))
    >>> line.split(" to ")[0]
    'the Prefect server at http://127.0.0.1:4200/api is busy: it answered 503 Service Unavailable'
    >>> busy_line(ValueError("no")) is None
    True
    """
    response = getattr(exc, "response", None)
    request = getattr(exc, "request", None) or getattr(response, "request", None)
    status = getattr(response, "status_code", None)
    if status not in (429, 503) or request is None:
        return None
    url = request.url
    api = url.path[: url.path.index("/api") + 4] if "/api" in url.path else ""
    return (
        f"the Prefect server at {url.scheme}://{url.netloc.decode()}{api} is busy: it answered {status} "
        f"{response.reason_phrase} to {request.method} {url.path}; the client's retries "
        "(PREFECT_CLIENT_MAX_RETRIES) are spent, nothing was lost: run the same command again once it is less busy"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if getattr(args, "passes_through", False):
        args.passed_through = rest  # ``run``: ESPnet3's launcher parses them
    elif rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    args.rerun = shlex.join(["espnet3-prefect", *(sys.argv[1:] if argv is None else argv)])
    signal.signal(signal.SIGTERM, _terminate_cleanly)
    _CtrlC.install()
    put_on_pythonpath(os.getcwd())  # recipe modules (src.inference.MyProvider) import on workers and in jobs
    try:
        status = args.handler(args)
    except ServerGoneError as exc:  # said once: what Prefect would still try to send cannot arrive
        _CtrlC.restore()
        # on a line of its own: Prefect's log sender may have left one unended ("All connection attempts failed")
        print(f"\nerror: {one_line(exc)}", file=sys.stderr)
        if argv is None:
            _leave_now(1)
        return 1
    except Espnet3PrefectError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2 if isinstance(exc, ValueError) else 1
    except KeyboardInterrupt:
        _CtrlC.restore()
        print("error: interrupted; finished shards are kept and a re-run resumes from them", file=sys.stderr)
        if argv is None:
            _leave_now(130)
        return 130
    except Exception as exc:  # a failed flow run: Prefect already logged the details
        print(f"error: {busy_line(exc) or f'{type(exc).__name__}: {one_line(exc)}'}", file=sys.stderr)
        return 1
    if argv is None and args.handler in _DONE_WHEN_RETURNED:
        _leave_done(status)
    return status


#: the handlers after whose return the console script has nothing left to do: a stage run in this
#: process (``run`` is not one of them: ESPnet3's training may leave exit hooks that matter)
_DONE_WHEN_RETURNED = (stages.run_infer, stages.run_metrics, stages.run_evaluate)


def _leave_done(status: int) -> None:
    """A stage command has returned: its server and cluster are closed, its outputs written. What is
    still queued for the Prefect API (a kept or ``PREFECT_API_URL`` server) is sent, bounded, and
    logging is shut down; then the process leaves at once. Python's own exit would tear every
    module down first (Prefect, Dask, torch): 0.8 s for a demo re-run that starts nothing, up to
    2-3 s after a flow on a loaded 2-core machine (``python -m benchmarks.run_phases``)."""
    import contextlib
    import logging

    if "prefect" in sys.modules:
        with contextlib.suppress(Exception):
            from prefect.logging.handlers import APILogHandler

            APILogHandler().flush()
        with contextlib.suppress(Exception):
            from prefect.events.worker import EventsWorker

            EventsWorker.drain_all(timeout=5)
    logging.shutdown()
    _leave_now(status)
