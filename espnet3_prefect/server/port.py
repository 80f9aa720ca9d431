"""One address per project: the embedded server of a state dir listens on the port it had last time.

Each run used to start its server on a new free port, so the "View at" links a run printed died
with it. The state dir keeps the server's database (every flow run of the project), and now its
port too: whenever a server of that state dir runs again (the next run, ``espnet3-prefect ui``), the
old links open. When that port is taken by something else, a free one is used (and remembered).
"""

from __future__ import annotations

import contextlib
import socket
from pathlib import Path

from espnet3_prefect._internal.atomic import atomic_write_text

PORT_FILE = "port"
"""In the state dir: the port its server listened on last (:func:`project_port`)."""


def project_port(home: Path, host: str = "127.0.0.1") -> int | None:
    """The port this state dir's server listened on last time, when it is free now: one address per
    project, so the links earlier runs printed open again whenever its server runs (its database keeps
    their flow runs). None: pick a free one."""
    try:
        port = int((home / PORT_FILE).read_text().strip())
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is free
            sock.bind((host, port))
        return port
    except (OSError, ValueError):
        return None


def remember_port(home: Path, api_url: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        atomic_write_text(home / PORT_FILE, str(int(api_url.rsplit(":", 1)[1].split("/")[0])))
