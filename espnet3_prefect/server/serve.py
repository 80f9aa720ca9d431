"""``python -m espnet3_prefect.server.serve --host H --port P --ssl-certfile C --ssl-keyfile K``: Prefect's
server (API, UI and its services) over HTTPS.

``prefect server start`` has no TLS options; this runs the same app it runs in the foreground (the
final app with its background services) in uvicorn with the server certificate and key of
:class:`~espnet3_prefect.server.https.ServerTLS`, given as paths. Settings come from the environment as for
``prefect server start`` (``PREFECT_SERVER_*``, the auth string included); started by
:func:`espnet3_prefect.server.process.start_server`.
"""

from __future__ import annotations

import argparse


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m espnet3_prefect.server.serve", description=__doc__)
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ssl-certfile", required=True)
    parser.add_argument("--ssl-keyfile", required=True)
    args = parser.parse_args(argv)

    import uvicorn
    from prefect.server.api.server import create_app
    from prefect.settings import get_current_settings

    server = get_current_settings().server
    print(
        f"espnet3-prefect: Prefect server (API, UI, services) over HTTPS on {args.host}:{args.port}, "
        f"certificate {args.ssl_certfile}",
        flush=True,
    )
    uvicorn.run(
        create_app(final=True),
        host=args.host,
        port=args.port,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        timeout_keep_alive=server.api.keepalive_timeout,
        ws_ping_interval=server.api.websocket_ping_interval,
        ws_ping_timeout=server.api.websocket_ping_timeout,
        log_level=str(server.logging_level).lower(),
    )


if __name__ == "__main__":
    main()
